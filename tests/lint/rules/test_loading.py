"""TPL401 (rules/loading.py): a script that saves a file at module level and loads it again
below reads back what it just wrote, on a device that exists."""

from __future__ import annotations

from torchplace.lint import lint_source

SCRIPT = """\
import torch
import torchvision

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torchvision.models.resnet18()
torch.save(model.state_dict(), "params.ckpt")
model.load_state_dict(torch.load("params.ckpt", weights_only=True))
other = torch.load("other.ckpt", weights_only=True)
early = torch.load("later.ckpt", weights_only=True)
torch.save(model.state_dict(), "later.ckpt")


def export(net):
    torch.save(net.state_dict(), "exported.ckpt")


again = torch.load("exported.ckpt", weights_only=True)
"""


def test_a_module_level_round_trip_is_left_alone() -> None:
    lines = [f.line for f in lint_source(SCRIPT, "train.py", select={"TPL401"})]
    assert 7 not in lines


def test_other_module_level_loads_are_still_reported() -> None:
    # a file never saved, one saved only below the load (an earlier run's), and one that a
    # function saves (it may never run)
    lines = [f.line for f in lint_source(SCRIPT, "train.py", select={"TPL401"})]
    assert lines == [8, 9, 17]


def test_weights_only_is_unchanged_for_module_level_round_trips() -> None:
    source = SCRIPT.replace(", weights_only=True", "")
    lines = [f.line for f in lint_source(source, "train.py", select={"TPL402"})]
    assert 7 in lines


# --- a `--gpu` option that only names the GPUs, a CPU flag, a reused buffer name ---

GPU_IDS = """\
import argparse
import os
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--gpu", type=str, default="0", help="specify GPU devices")
args = parser.parse_args()
os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu


def main(model):
    model = model.cuda()
    try:
        state = torch.load("log/best_model.pth", weights_only=True)
    except OSError:
        state = None
    return state
"""


def test_a_gpu_option_that_only_names_the_gpus_leaves_a_cuda_only_script() -> None:
    assert not lint_source(GPU_IDS, "train.py", select={"TPL401"})


def test_a_gpu_flag_is_a_choice_and_the_load_is_reported() -> None:
    flag = GPU_IDS.replace('type=str, default="0"', 'action="store_true"')
    assert [f.line for f in lint_source(flag, "train.py", select={"TPL401"})] == [14]


def test_a_tested_gpu_option_is_a_choice_and_the_load_is_reported() -> None:
    tested = GPU_IDS.replace(
        "    model = model.cuda()\n", "    if args.gpu:\n        model = model.cuda()\n"
    )
    assert [f.line for f in lint_source(tested, "train.py", select={"TPL401"})] == [15]


# --- a script that demands CUDA (`assert torch.cuda.is_available()`) has no CPU path ---

DEMANDS_CUDA = """\
import torch

assert torch.cuda.is_available(), "Error: CUDA not found!"
net = Net()
net.load_state_dict(torch.load("./checkpoint/ckpt.pth", weights_only=True))
net = torch.nn.DataParallel(net, device_ids=range(torch.cuda.device_count()))
net.cuda()
"""


def test_an_assert_that_cuda_is_available_leaves_a_cuda_only_script() -> None:
    assert not lint_source(DEMANDS_CUDA, "train.py", select={"TPL401"})


def test_a_cuda_availability_test_that_chooses_is_still_a_cpu_path() -> None:
    choosing = DEMANDS_CUDA.replace(
        'assert torch.cuda.is_available(), "Error: CUDA not found!"\n', ""
    ).replace("net.cuda()", "if torch.cuda.is_available():\n    net.cuda()")
    assert [f.line for f in lint_source(choosing, "train.py", select={"TPL401"})] == [4]


def test_a_gpu_count_tested_in_a_condition_is_still_a_cpu_path() -> None:
    choosing = DEMANDS_CUDA.replace(
        'assert torch.cuda.is_available(), "Error: CUDA not found!"\n', ""
    ).replace("net.cuda()", "if torch.cuda.device_count() > 0:\n    net.cuda()")
    assert [f.line for f in lint_source(choosing, "train.py", select={"TPL401"})] == [4]


USE_CPU = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--use_cpu", action="store_true")
args = parser.parse_args()


def main(model):
    if not args.use_cpu:
        model = model.cuda()
    state = torch.load("log/best_model.pth", weights_only=True)
    return state
"""


def test_a_cuda_move_under_a_cpu_flag_leaves_a_cpu_path_and_the_load_is_reported() -> None:
    assert [f.line for f in lint_source(USE_CPU, "evaluate.py", select={"TPL401"})] == [12]


def test_a_cuda_move_under_no_test_is_still_a_cuda_only_branch() -> None:
    unguarded = USE_CPU.replace("    if not args.use_cpu:\n        model", "    model").replace(
        'parser.add_argument("--use_cpu", action="store_true")\n', ""
    )
    assert not lint_source(unguarded, "evaluate.py", select={"TPL401"})


REUSED_BUFFER = """\
import io
import torch
import torch.distributed as dist


def all_gather(data, tensors):
    buffer = io.BytesIO()
    torch.save(data, buffer)
    out = []
    for tensor in tensors:
        buffer = io.BytesIO(tensor.cpu().numpy())
        out.append(torch.load(buffer))
    return out


def round_trip(data):
    buffer = io.BytesIO()
    torch.save(data, buffer)
    buffer.seek(0)
    return torch.load(buffer)
"""


def test_a_buffer_name_rebound_to_received_bytes_is_not_a_round_trip() -> None:
    lines = [f.line for f in lint_source(REUSED_BUFFER, "misc.py", select={"TPL402"})]
    assert lines == [12]


# ---- a load in the CUDA branch of an availability check, mapped to the CPU in the other

VOCODER = """\
import torch


class Vocoder:
    def __init__(self, checkpoint_path, model):
        self.model = model
        if torch.cuda.is_available():
            state = torch.load(checkpoint_path, weights_only=True)
        else:
            state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
        if not torch.cuda.is_available():
            print("running on the CPU")
        extra = torch.load(checkpoint_path + ".extra", weights_only=True)
        self.model.load_state_dict({**state, **extra})
"""


def test_a_load_under_a_cuda_availability_check_is_left_alone() -> None:
    lines = [f.line for f in lint_source(VOCODER, "vocoder.py", select={"TPL401"})]
    assert lines == [13]  # after the check, on every machine


# --- a save given its path by keyword ---

KEYWORD_SAVE = """\
import torch
from pathlib import Path

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(2, 2).to(device)
PATH = Path("models") / "m.pth"
torch.save(obj=model.state_dict(), f=PATH)
model.load_state_dict(torch.load(PATH, weights_only=True))
model.load_state_dict(torch.load(f=PATH, weights_only=True))
other = torch.load(Path("models") / "other.pth", weights_only=True)
"""


def test_a_keyword_save_is_a_module_level_round_trip() -> None:
    # `torch.save(obj=..., f=PATH)` writes PATH as `torch.save(..., PATH)` does; a path never
    # saved is still reported
    found = lint_source(KEYWORD_SAVE, "nb.py", select={"TPL401"})
    assert [f.line for f in found] == [10]


def test_a_keyword_save_of_host_data_is_left_alone() -> None:
    source = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"


def cache(feats):
    torch.save(obj=feats.cpu(), f="feats.pt")


def restore():
    return torch.load("feats.pt", weights_only=True)


def restore_other():
    return torch.load("other.pt", weights_only=True)
"""
    found = lint_source(source, "cache.py", select={"TPL401"})
    assert [f.line for f in found] == [15]
