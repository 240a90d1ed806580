"""Rule behaviour found on code the corpus did not hold yet (a fourth round of repositories):
a per-batch helper of a script that never names a device (TPL201)."""

from __future__ import annotations

import pytest

from torchplace.lint import lint_source

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL201: a helper the batch loop calls, in a script that never names a device

HOST_SCRIPT = """\
import torch
from torch.optim import Adam


def ppo(ac, data, iters):
    opt = Adam(ac.parameters())

    def compute_loss(data):
        logp = ac(data)
        kl = logp.mean().item()
        return -logp.mean(), kl

    def update():
        for i in range(iters):
            opt.zero_grad()
            loss, kl = compute_loss(data)
            loss.backward()
            opt.step()

    for epoch in range(10):
        update()


if __name__ == "__main__":
    ppo(torch.nn.Linear(2, 2), torch.zeros(2), 3)
"""


def test_a_per_batch_helper_of_a_script_that_names_no_device_reads_host_values() -> None:
    assert _lines(HOST_SCRIPT, "TPL201") == []


def test_the_same_helper_is_reported_once_the_script_moves_its_model() -> None:
    moved = HOST_SCRIPT.replace("torch.nn.Linear(2, 2)", "torch.nn.Linear(2, 2).cuda()")
    assert _lines(moved, "TPL201") == [10]


def test_the_same_helper_of_a_library_module_is_still_reported() -> None:
    # no `__main__` block: the module's tensors come from its callers
    library = HOST_SCRIPT.split("\n\nif __name__")[0] + "\n"
    assert _lines(library, "TPL201") == [10]


# ---- TPL401: the CPU branch of a load maps each storage to itself

CUDA_BRANCH = """\
import torch


def restore(args, model, path):
    if args.cuda > 0:
        checkpoint = torch.load(path)
    else:
        checkpoint = torch.load(path, map_location=(lambda storage, loc: storage))
    model.load_state_dict(checkpoint["model"])
"""


def test_a_bare_load_whose_else_maps_storages_to_themselves_runs_only_with_cuda() -> None:
    assert _lines(CUDA_BRANCH, "TPL401") == []


def test_a_bare_load_whose_else_maps_elsewhere_is_still_reported() -> None:
    other = CUDA_BRANCH.replace("lambda storage, loc: storage", "lambda storage, loc: loc")
    assert _lines(other, "TPL401") == [6]


# ---- TPL401: an unused import is no sign of one process per GPU

CUDA_ONLY = """\
import os

import torch
import torch.utils.data.distributed


def main(args, model):
    model = torch.nn.DataParallel(model).cuda()
    if os.path.isfile(args.pretrained):
        checkpoint = torch.load(args.pretrained)
        model.load_state_dict(checkpoint["state_dict"])
"""


def test_a_cuda_only_script_importing_the_distributed_module_has_nothing_to_remap() -> None:
    assert _lines(CUDA_ONLY, "TPL401") == []


def test_a_cuda_only_script_that_uses_ranks_may_load_on_another_gpu() -> None:
    sampler = "    sampler = torch.utils.data.distributed.DistributedSampler(args.data)\n"
    ranked = CUDA_ONLY.replace("    model = torch.nn", sampler + "    model = torch.nn")
    assert _lines(ranked, "TPL401") == [11]


# ---- TPL301: an optimizer handed to a helper computes nothing on the device

TIMED_EPOCH = """\
import time

import torch


def get_learning_rate(optimizer):
    return [g["lr"] for g in optimizer.param_groups]


def train(loader, model, criterion, optimizer):
    end = time.time()
    current_lr = get_learning_rate(optimizer)[0]
    for i, (x, y) in enumerate(loader):
        data_time = time.time() - end
        x = x.cuda()
        y = y.cuda()
        loss = criterion(model(x), y)
        print(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time = time.time() - end
        end = time.time()


def main(loader):
    model = torch.nn.Linear(2, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    criterion = torch.nn.CrossEntropyLoss().cuda()
    train(loader, model, criterion, optimizer)
"""


def test_reading_an_optimizers_settings_before_the_loop_is_host_work() -> None:
    assert _lines(TIMED_EPOCH, "TPL301") == []


def test_the_same_clock_is_reported_when_nothing_in_the_step_waits() -> None:
    unsynced = TIMED_EPOCH.replace("        print(loss.item())\n", "")
    assert _lines(unsynced, "TPL301") == [11]


# ---- TPL402: a mapping unpacked into another call is a copy

KWARGS_LOADS = """\
import os

import torch


def load(model, apath, pre_train="", cpu=False):
    kwargs = {}
    if cpu:
        kwargs = {"map_location": lambda storage, loc: storage}
    if pre_train == "download":
        state = torch.utils.model_zoo.load_url(model.url, **kwargs)
    else:
        state = torch.load(os.path.join(apath, "model_latest.pt"), **kwargs)
    model.load_state_dict(state)
"""


def test_a_load_whose_kwargs_another_call_unpacks_still_lacks_weights_only() -> None:
    assert _lines(KWARGS_LOADS, "TPL402") == [11, 13]


def test_a_mapping_handed_on_itself_may_gain_weights_only() -> None:
    handed = KWARGS_LOADS.replace("load_url(model.url, **kwargs)", "load_url(model.url, kwargs)")
    assert _lines(handed, "TPL402") == [11]


# ---- TPL201: every `math` function converts its tensor argument with `float()`

PSNR = """\
import math


def evaluate(model, loader, device):
    model = model.to(device)
    for lr, hr in loader:
        lr, hr = lr.to(device), hr.to(device)
        mse = (model(lr) - hr).pow(2).mean()
        print(-10 * math.log10(mse), math.log2(mse), math.fabs(mse))
"""


def test_math_log10_log2_and_fabs_of_a_device_value_read_it() -> None:
    assert _lines(PSNR, "TPL201") == [9, 9, 9]


def test_math_of_a_python_number_reads_nothing() -> None:
    host = PSNR.replace("mse = (model(lr) - hr).pow(2).mean()", "mse = 0.5")
    assert _lines(host, "TPL201") == []


# ---- TPL401: a setting read from an object of settings is named by the setting

RESUME = """\
import torch


def main(config, model):
    device = torch.device("cuda" if config["n_gpu"] > 0 else "cpu")
    checkpoint = torch.load(config.resume)
    model.load_state_dict(checkpoint["state_dict"])
"""


def test_a_checkpoint_path_read_from_a_config_object_is_a_checkpoint() -> None:
    assert _lines(RESUME, "TPL401") == [6]


@pytest.mark.parametrize("path", ["config.vocab_file", "self.vocab.path", "args.config"])
def test_a_path_whose_setting_or_owner_names_host_data_is_left_alone(path: str) -> None:
    assert _lines(RESUME.replace("config.resume", path), "TPL401") == []


# ---- TPL601: memory statistics answer 0 where CUDA was never initialised

STATS = """\
import torch


def main(model, loader):
    for x in loader:
        model(x)
    print(torch.cuda.max_memory_allocated() / 2**30, torch.cuda.memory_reserved())
    print(torch.cuda.get_device_name(0))
"""


def test_memory_statistics_are_no_cuda_only_calls_but_the_device_name_is() -> None:
    assert _lines(STATS, "TPL601") == [8]


# ---- TPL501: a view of a whole factory result, and modules placed as they are built

ENCODER = """\
import torch
import torch.nn as nn


class Enc(nn.Module):
    def __init__(self, means, n, d):
        super().__init__()
        self.channel_means = torch.tensor(means, dtype=torch.float32)[None, :, None, None]
        self.first = torch.tensor(means)[0]
        self.clist = [nn.Linear(d, n).cuda() for i in range(3)]
        self.heads = nn.ModuleList([nn.Linear(d, n).cuda() for i in range(3)])

    def forward(self, x):
        return x - self.channel_means + self.first + self.clist[0](x) + self.heads[0](x)
"""


def test_a_view_of_a_factory_and_a_list_of_placed_modules_are_unregistered_state() -> None:
    # `[0]` may pick one number: not reported; the ModuleList registers its modules
    assert _lines(ENCODER, "TPL501") == [8, 10]


# ---- TPL301: a nested timer's clock reads are not the outer timer's stop

NESTED_TIMERS = """\
import time

import torch


def main(model, images, device):
    model = model.to(device)
    buffer = torch.zeros(1, 3, 8, 8, device=device)
    for im in images:
        total_tic = time.time()
        buffer.copy_(torch.from_numpy(im))
        det_tic = time.time()
        out = model(buffer)
        det_toc = time.time()
        detect_time = det_toc - det_tic
        boxes = out.cpu().numpy()
        total_toc = time.time()
        total_time = total_toc - total_tic
        print(detect_time, total_time, boxes)
"""


def test_an_outer_timer_is_read_at_its_own_stop_after_the_copy_back() -> None:
    # the detection timer reads no result back: reported; the total one waits on `.cpu()`
    assert _lines(NESTED_TIMERS, "TPL301") == [12]


def test_an_outer_timer_read_before_any_copy_back_is_reported() -> None:
    unsynced = NESTED_TIMERS.replace("boxes = out.cpu().numpy()", "boxes = out")
    assert _lines(unsynced, "TPL301") == [10, 12]


# ---- TPL201: a pathlib path and a string method's result are host values

OUTPUT_PATH = """\
from pathlib import Path

import torch


def generate(model, prompts, out, device):
    model = model.to(device)
    for prompt in prompts:
        images, texts = model.sample(prompt)
        name = texts[0]
        folder = Path(out) / name.replace(" ", "_")[:100]
        print(f"saving to {str(folder)}, {name.lower()!r}")
        print(f"{images.mean()}")
"""


def test_a_path_built_from_any_value_and_a_string_method_read_no_tensor() -> None:
    assert _lines(OUTPUT_PATH, "TPL201") == [13]


# ---- TPL201: images a loop that trains nothing logs, copied by hand

LOGGED_IMAGES = """\
import torch
from torchvision.utils import make_grid


def valid(model, loader, writer, device):
    model.eval()
    with torch.no_grad():
        for batch_idx, (data, target) in enumerate(loader):
            data, target = data.to(device), target.to(device)
            output = model(data)
            writer.add_image("input", make_grid(data.cpu(), nrow=8, normalize=True))
            writer.add_image("out", output.cpu())
"""


def test_images_copied_for_tensorboard_by_a_loop_that_trains_nothing_are_its_output() -> None:
    assert _lines(LOGGED_IMAGES, "TPL201") == []


def test_the_same_copies_in_a_training_loop_are_reported() -> None:
    training = LOGGED_IMAGES.replace(
        '            writer.add_image("out"',
        '            output.sum().backward()\n            writer.add_image("out"',
    )
    assert _lines(training, "TPL201") == [11, 13]


# ---- TPL501: a table of numbers read one element at a time by a loop's counter

WEIGHTS = """\
import torch
import torch.nn as nn


class MultiScale(nn.Module):
    def __init__(self, num_scales=5, l_weight=0.32):
        super().__init__()
        self.loss_weights = torch.FloatTensor([l_weight / 2**s for s in range(num_scales)])
        self.table = torch.tensor([1.0, 2.0, 3.0])

    def forward(self, output, target):
        value = 0
        for i, output_ in enumerate(output):
            value += self.loss_weights[i] * (output_ - target).abs().mean()
        return value + self.table[target]
"""


def test_a_table_of_numbers_picked_by_a_loop_counter_is_a_0_dim_value_each_time() -> None:
    # `self.table[target]`: indexed by a tensor, which may live on the GPU
    assert _lines(WEIGHTS, "TPL501") == [9]


# ---- TPL401: a round trip through file objects opened on one path

HANDLES = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true")
args = parser.parse_args()
model = Net()
if args.cuda:
    model.cuda()
model_name = "poly_music.pt"
for ep in range(10):
    train(ep)
    with open(model_name, "wb") as f:
        torch.save(model, f)
model = torch.load(open(model_name, "rb"))
with open("other.pt", "rb") as f:
    other = torch.load(f)
"""


def test_a_load_through_a_handle_on_the_path_a_handle_saved_to_is_a_round_trip() -> None:
    # the second load reads another file through a handle of the same name
    assert _lines(HANDLES, "TPL401") == [18]


# ---- TPL401: code commented out chooses no CPU path

PINNED = """\
import torch


def main(specs, path):
    decoder = Decoder(specs).cuda()
    # if torch.cuda.device_count() > 1:
    #     decoder = torch.nn.DataParallel(decoder)
    data = torch.load(path)
    decoder.load_state_dict(data["model_state_dict"])
"""


def test_a_cuda_only_script_whose_cuda_test_is_commented_out_has_nothing_to_remap() -> None:
    assert _lines(PINNED, "TPL401") == []


def test_the_same_test_in_code_is_a_cpu_path() -> None:
    live = PINNED.replace("    # if torch.cuda.device_count() > 0:", "")
    live = live.replace("    # if", "    if").replace("    #     decoder", "        decoder")
    assert _lines(live, "TPL401") == [8]


# ---- a `test.py` that is a flat program is linted

FLAT = """\
import torch

from retinanet import RetinaNet

print("Loading model..")
net = RetinaNet()
net.load_state_dict(torch.load("./checkpoint/params.pth"))
net.eval()
"""


def test_a_flat_program_named_test_py_is_linted() -> None:
    assert _lines(FLAT, "TPL402", path="test.py") == [7]


def test_a_test_module_of_constants_and_checks_is_left_alone() -> None:
    module = "import torch\n\nSIZE = 4\n\n\ndef test_load():\n    torch.load('x.pt')\n"
    assert _lines(module, "TPL402", path="test.py") == []


# ---- TPL201: `.data[0]` of a loss, the `.item()` before PyTorch 0.4

OLD_STYLE = """\
import torch
import torch.nn.functional as F
from torch.autograd import Variable


def train(net, criterion, optimizer, loader):
    net.cuda()
    train_loss = 0
    for inputs, targets in loader:
        inputs, targets = Variable(inputs.cuda()), Variable(targets.cuda())
        optimizer.zero_grad()
        out = net(inputs)
        loss = criterion(out, targets)
        loss.backward()
        optimizer.step()
        train_loss += loss.data[0]
        test_loss = F.nll_loss(out, targets).data[0]
        first = out.data[0]
"""


def test_the_data_index_of_a_loss_is_a_read_and_of_a_batch_a_row() -> None:
    assert _lines(OLD_STYLE, "TPL201") == [16, 17]


# ---- TPL101: no fix that would make a trainable leaf a computed copy

LEAF = """\
import torch


def main(device):
    w = torch.zeros(3, requires_grad=True)
    w.to(device)
    x = torch.zeros(3)
    x.to(device)
    opt = torch.optim.SGD([w], lr=0.1)
"""


def test_a_discarded_move_of_a_tensor_that_requires_grad_is_reported_without_a_fix() -> None:
    found = lint_source(LEAF, "train.py", select={"TPL101"})
    assert [(f.line, f.fix is not None) for f in found] == [(6, False), (8, True)]
    assert "create it on the device" in found[0].message


# ---- TPL801: parameter groups appended from a list of the model's submodules

GROUPS = """\
import torch


def main_worker(args, model):
    modules_ori = [model.layer0, model.layer1, model.layer2]
    params_list = []
    for module in modules_ori:
        params_list.append(dict(params=module.parameters(), lr=args.base_lr))
    for module in [model.ppm, model.cls]:
        params_list.append({"params": module.parameters(), "lr": args.base_lr * 10})
    optimizer = torch.optim.SGD(params_list, lr=args.base_lr)
    model = torch.nn.DataParallel(model.cuda())
    return optimizer
"""


def test_groups_of_the_submodules_a_loop_walks_are_the_models_parameters() -> None:
    assert _lines(GROUPS, "TPL801") == [11]


def test_the_same_groups_built_after_the_move_are_left_alone() -> None:
    moved = GROUPS.replace(
        "    params_list = []\\n", "    model = model.cuda()\\n    params_list = []\\n"
    )
    moved = moved.replace("    model = torch.nn.DataParallel(model.cuda())\n", "")
    assert _lines(moved, "TPL801") == []


# ---- TPL201: a method called through a global the script binds to an instance

GLOBAL_CRITERION = """\
import torch
import torch.nn as nn


class FocalLoss(nn.Module):
    def forward(self, preds, targets):
        loss = (preds - targets).abs().sum()
        print("loss: %.3f" % float(loss))
        return loss


net = nn.Linear(4, 2).cuda()
criterion = FocalLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)


def train(loader):
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        loss = criterion(net(x), y)
        loss.backward()
        optimizer.step()
"""


def test_a_method_of_an_instance_the_script_binds_globally_runs_in_the_batch_loop() -> None:
    assert _lines(GLOBAL_CRITERION, "TPL201") == [8]


def test_a_global_bound_to_something_else_as_well_is_not_followed() -> None:
    other = GLOBAL_CRITERION.replace(
        "optimizer = torch", "criterion = nn.MSELoss()\\noptimizer = torch"
    )
    assert _lines(other, "TPL201") == []


# ---- TPL102: a cast to a CUDA tensor type in a module's method

CASTS = """\
import torch
import torch.nn as nn


class RMILoss(nn.Module):
    def forward(self, la_vectors, pr_vectors, n, c):
        la_vectors = la_vectors.view([n, c, -1]).type(torch.cuda.DoubleTensor)
        pr_vectors = pr_vectors.view([n, c, -1]).type("torch.cuda.FloatTensor")
        host = pr_vectors.type(torch.FloatTensor)
        same = pr_vectors.type(la_vectors.type())
        return la_vectors + pr_vectors + host + same
"""


def test_a_cast_to_a_cuda_tensor_type_in_forward_picks_the_modules_device() -> None:
    assert _lines(CASTS, "TPL102") == [7, 8]


LOSS_MAP = """\
class Logger:
    def __init__(self):
        self.losses = {}

    def log(self, losses):
        for loss_name in losses:
            self.losses[loss_name] = losses[loss_name].data[0]


def train(netG, loader, optimizer):
    netG.cuda()
    logger = Logger()
    for batch in loader:
        real = batch.cuda()
        optimizer.zero_grad()
        loss_G = (netG(real) - real).abs().mean()
        loss_G.backward()
        optimizer.step()
        logger.log({"loss_G": loss_G})
"""


def test_the_data_index_of_an_entry_of_a_map_of_losses_is_a_read() -> None:
    assert _lines(LOSS_MAP, "TPL201") == [7]


# ---- TPL103: a factory indexing an assignment's target is not placed by a later move

INDEXED_TARGET = """\
import torch
import torch.nn as nn


class ProbAttention(nn.Module):
    def forward(self, context_in, V, scores, index):
        B, H, L_V, D = V.shape
        attn = torch.softmax(scores, dim=-1)
        context_in[torch.arange(B)[:, None], index, :] = torch.matmul(attn, V)
        attns = (torch.ones([B, H, L_V, L_V]) / L_V).type_as(attn).to(attn.device)
        return context_in, attns
"""


def test_a_factory_indexing_the_target_is_not_placed_by_a_move_of_another_value() -> None:
    assert _lines(INDEXED_TARGET, "TPL103") == [9]


# ---- TPL201: a script without the `.py` suffix calls the modules beside it

UTILS = """\
def tensor2image(tensor):
    return 127.5 * (tensor[0].cpu().float().numpy() + 1.0)
"""

SCRIPT = """\
#!/usr/bin/python3
import torch

from utils import tensor2image

netG = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.Adam(netG.parameters())
for batch in loader:
    real = batch.cuda()
    fake = netG(real)
    loss = (fake - real).abs().mean()
    loss.backward()
    optimizer.step()
    image = tensor2image(fake)
"""


def test_a_suffixless_python_script_is_a_caller_of_the_modules_beside_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    found = _project(tmp_path_factory.mktemp("p"), {"utils.py": UTILS, "train": SCRIPT}, "TPL201")
    assert found == [("utils.py", 2)]
    # without a Python shebang it is some other file
    other = {"utils.py": UTILS, "train": SCRIPT.replace("#!/usr/bin/python3\n", "")}
    assert _project(tmp_path_factory.mktemp("q"), other, "TPL201") == []


# ---- TPL301: a batch whose entries are each replaced by their move is placed

ENTRIES = """\
import time


def run_epoch(model, loader, optimizer, device):
    end = time.time()
    for iter_id, batch in enumerate(loader):
        data_time = time.time() - end
        for k in batch:
            batch[k] = batch[k].to(device=device, non_blocking=True)
        output, loss = model(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time = time.time() - end
        end = time.time()
"""


def test_a_step_on_a_batch_moved_entry_by_entry_is_timed_work() -> None:
    assert _lines(ENTRIES, "TPL301") == [5]


# ---- TPL401: a file named for a training log holds the numbers a run recorded

LOGS = """\
import os

import torch


class Checkpoint:
    def __init__(self, args):
        device = "cuda" if args.cuda else "cpu"
        self.log = torch.load(os.path.join(args.dir, "psnr_log.pt"))
        self.model = torch.load(os.path.join(args.log_dir, "model.pt"))
"""


def test_a_log_file_is_host_data_and_a_model_in_a_log_folder_is_not() -> None:
    assert _lines(LOGS, "TPL401") == [10]


# ---- TPL104: a flag-chosen fallback spelled with the CPU first

HOLDER = """\
import torch


class Trainer:
    def __init__(self, args, model):
        self.model = model
        self.device = torch.device("cpu") if args.cpu else torch.device("cuda")
        self.other = torch.device("cuda")
"""


def test_a_device_chosen_by_a_flag_with_the_cpu_first_is_a_fallback() -> None:
    assert _lines(HOLDER, "TPL104") == [8]


# ---- TPL501: helpers the forward calls once it has placed the attribute read it placed

PLACED_IN_FORWARD = """\
import torch
import torch.nn as nn


class ProposalTarget(nn.Module):
    def __init__(self, means):
        super().__init__()
        self.MEANS = torch.FloatTensor(means)

    def forward(self, rois, gt_boxes):
        self.MEANS = self.MEANS.type_as(gt_boxes)
        return self._sample(rois, gt_boxes)

    def _sample(self, rois, gt_boxes):
        return self._targets(rois - gt_boxes)

    def _targets(self, targets):
        return targets - self.MEANS.expand_as(targets)
"""


def test_helpers_called_after_the_placing_rebinding_read_the_placed_attribute() -> None:
    assert _lines(PLACED_IN_FORWARD, "TPL501") == []


def test_a_helper_also_called_before_the_placing_reads_it_where_it_was_built() -> None:
    early = PLACED_IN_FORWARD.replace(
        "        self.MEANS = self.MEANS.type_as(gt_boxes)\n",
        "        self._targets(rois)\n        self.MEANS = self.MEANS.type_as(gt_boxes)\n",
    )
    assert _lines(early, "TPL501") == [8]


# ---- TPL201: a copy handed to a NumPy metric of scikit-image in a loop that trains nothing

SKIMAGE = """\
import torch
from skimage.metrics import peak_signal_noise_ratio


def evaluate(model, loader, device):
    model.eval()
    with torch.no_grad():
        for lr, hr in loader:
            lr, hr = lr.to(device), hr.to(device)
            sr = model(lr)
            psnr = peak_signal_noise_ratio(hr.cpu().numpy(), sr.cpu().numpy())
            print(psnr)
            other = sr.cpu().numpy().mean()
"""


def test_copies_for_a_numpy_metric_library_in_an_evaluation_loop_are_its_work() -> None:
    assert _lines(SKIMAGE, "TPL201") == [13]


# ---- TPL201: a function called after a loop's once-per-tick `continue` guard

TICKS = """\
import torch


def report(value):
    return float(value.cpu())


def training_loop(G, loader, optimizer, device, kimg_per_tick):
    G = G.to(device)
    cur_nimg = tick_start_nimg = 0
    for images in loader:
        loss = G(images.to(device)).mean()
        loss.backward()
        optimizer.step()
        cur_nimg += images.shape[0]
        if cur_nimg < tick_start_nimg + kimg_per_tick * 1000:
            continue
        tick_start_nimg = cur_nimg
        print(report(loss))
"""


def test_a_call_after_a_once_per_tick_guard_is_not_per_batch() -> None:
    assert _lines(TICKS, "TPL201") == []


def test_the_same_call_without_the_guard_is_per_batch() -> None:
    every = TICKS.replace("            continue\n", "            pass\n")
    assert _lines(every, "TPL201") == [5]


# ---- TPL201: a metric class's own method copying what it is handed into its NumPy state

FEATURE_STATS = """\
import numpy as np
import torch


class FeatureStats:
    def __init__(self, dim):
        self.raw_mean = np.zeros([dim], dtype=np.float64)

    def append(self, x):
        self.raw_mean += x.sum(axis=0)

    def append_torch(self, x):
        self.append(x.cpu().numpy())


def compute(detector, loader, device, dim):
    stats = FeatureStats(dim)
    detector = detector.to(device)
    with torch.no_grad():
        for images in loader:
            stats.append_torch(detector(images.to(device)))
    return stats
"""


def test_a_metric_objects_own_copy_into_its_numpy_state_is_its_work() -> None:
    assert _lines(FEATURE_STATS, "TPL201") == []


def test_a_class_without_numpy_state_copying_per_batch_is_reported() -> None:
    plain = FEATURE_STATS.replace("np.zeros([dim], dtype=np.float64)", "0.0")
    assert _lines(plain, "TPL201") == [13]
