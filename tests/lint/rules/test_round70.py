"""Round 70: factories matched to tensors the function derives from its parameters (TPL103);
timings around a helper's move and an own model run on inline device tensors (TPL301); a
generator pinning and moving what it yields (TPL702); Gradio handlers registered through a
function they are handed to, and a "Train" button's handler (TPL403)."""

from __future__ import annotations

from pathlib import Path

from .helpers import lines as _lines
from .helpers import project as _project

REBOUND_BY_WHERE = """\
import torch

def stats(output: torch.LongTensor, target: torch.LongTensor, classes: int, ignore=None):
    batch = output.shape[0]
    if ignore is not None:
        skip = target == ignore
        output = torch.where(skip, -1, output)
        target = torch.where(skip, -1, target)
    counts = torch.zeros(batch, classes, dtype=torch.long)
    for i in range(batch):
        matched = torch.where(output[i] == target[i], target[i], -1)
        counts[i] = torch.histc(matched.float(), bins=classes).long()
    return counts
"""


def test_a_parameter_rebound_to_a_torch_op_of_itself_stays_a_tensor() -> None:
    assert _lines(REBOUND_BY_WHERE, "TPL103") == [9]


def test_a_parameter_rebound_to_a_new_tensor_is_no_longer_matched() -> None:
    rebuilt = REBOUND_BY_WHERE.replace(
        "torch.where(skip, -1, output)", "torch.tensor(output.tolist())"
    ).replace("torch.where(skip, -1, target)", "torch.as_tensor(target.tolist())")
    assert _lines(rebuilt, "TPL103") == []


ON_A_PARAMETERS_DEVICE = """\
import torch

def shuffle(x1, n, d):
    k = torch.zeros(n * (d + 1), n * (d + 1), device=x1.device)
    perm = torch.arange(n * (d + 1)).view(d + 1, n).t().reshape(-1)
    return k[..., perm, :]
"""


def test_an_index_into_a_tensor_built_on_a_parameters_device() -> None:
    assert _lines(ON_A_PARAMETERS_DEVICE, "TPL103") == [5]


def test_a_tensor_built_on_a_host_device_is_left_alone() -> None:
    host = ON_A_PARAMETERS_DEVICE.replace("device=x1.device", 'device="cpu"')
    assert _lines(host, "TPL103") == []


HELPER_MOVE = """\
import time

def to_device(data, device, non_blocking=False):
    if isinstance(data, dict):
        return {k: to_device(v, device, non_blocking) for k, v in data.items()}
    return data.to(device, non_blocking=non_blocking)

class Trainer:
    def train_epoch(self, model, optim, loader):
        stats = {}
        for batch in loader:
            batch = to_device(batch, self.device, non_blocking=True)
            began = time.perf_counter()
            loss = model(**batch)
            stats["forward"] = time.perf_counter() - began
            loss.backward()
            optim.step()
"""


def test_a_helper_named_for_the_move_places_the_batch_it_is_handed() -> None:
    assert _lines(HELPER_MOVE, "TPL301") == [13]


def test_a_helper_handed_no_device_places_nothing() -> None:
    unmoved = HELPER_MOVE.replace(
        "to_device(batch, self.device, non_blocking=True)", "to_device(batch, None)"
    )
    assert _lines(unmoved, "TPL301") == []


OWN_MODEL = """\
import time
import torch

class Synth:
    def __init__(self, cfg):
        self.gpt = UnifiedVoice(**cfg)

    def infer(self, tokens, codes):
        total = 0.0
        for i in range(len(codes)):
            began = time.perf_counter()
            latent = self.gpt(tokens, torch.tensor([tokens.shape[-1]], device=tokens.device), codes[i])
            total += time.perf_counter() - began
        return total
"""


def test_an_own_model_run_on_a_tensor_the_call_puts_on_the_device() -> None:
    assert _lines(OWN_MODEL, "TPL301") == [11]


def test_a_method_of_the_class_run_on_a_host_tensor_is_not_device_work() -> None:
    host = OWN_MODEL.replace("device=tokens.device", 'device="cpu"')
    assert _lines(host, "TPL301") == []


LABELS = """\
import numpy as np
import torch

def iterate_random_labels(dataset, device, batch):
    while True:
        c = [dataset.get_label(np.random.randint(len(dataset))) for _ in range(batch)]
        c = torch.from_numpy(np.stack(c)).pin_memory().to(device)
        yield c
"""


def test_a_generator_pinning_and_moving_each_item_it_yields() -> None:
    assert _lines(LABELS, "TPL702") == [7]


def test_a_generator_pinning_what_it_yields_works_as_a_loader() -> None:
    pinned_only = LABELS.replace(".pin_memory().to(device)", ".pin_memory()")
    assert _lines(pinned_only, "TPL702") == []


DEMO = """\
import gradio as gr

def create_demo(run):
    with gr.Blocks() as demo:
        button = gr.Button("Run")
        button.click(fn=run, inputs=[], outputs=[])
    return demo
"""

APP = """\
import gradio as gr
import torch
from demo import create_demo

def run(image):
    adapter = torch.load("adapter.pth", map_location="cpu", weights_only=True)
    return adapter

def keep(image):
    return torch.load("other.pth", map_location="cpu", weights_only=True)

with gr.Blocks() as app:
    create_demo(run)
    keep_fn = keep
"""


def test_a_handler_registered_by_the_function_it_is_handed_to(tmp_path: Path) -> None:
    found = _project(tmp_path, {"demo.py": DEMO, "app.py": APP}, "TPL403")
    assert found == [("app.py", 6)]


TRAIN_BUTTON = """\
import gradio as gr
import torch

def do_train(name, epochs):
    state = torch.load(f"loras/{name}.bin", map_location="cpu", weights_only=True)
    return state

def do_predict(name):
    return torch.load(f"loras/{name}.bin", map_location="cpu", weights_only=True)

with gr.Blocks() as app:
    gr.Button("Train").click(do_train, [], [])
    gr.Button("Predict").click(do_predict, [], [])
"""


def test_a_train_buttons_handler_loads_what_it_trains() -> None:
    assert _lines(TRAIN_BUTTON, "TPL403") == [9]


DEMO_CALLBACK = """\
import torch

class Demo:
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if (trainer.global_step - 1) % self.demo_every != 0 or self.last == trainer.global_step:
            return
        self.last = trainer.global_step
        noise = torch.randn([4, 2, 100]).to(module.device)
        fakes = module.sample(noise)
        return fakes.cpu()
"""


def test_a_guard_leaving_on_most_steps_joined_by_or_makes_what_follows_rare() -> None:
    assert _lines(DEMO_CALLBACK, "TPL201") == []


def test_a_guard_on_a_setting_alone_leaves_what_follows_per_batch() -> None:
    setting = DEMO_CALLBACK.replace(
        "(trainer.global_step - 1) % self.demo_every != 0 or self.last == trainer.global_step",
        "self.last == trainer.global_step",
    )
    assert _lines(setting, "TPL201") == [10]


LAZY_IN_A_LOOP = """\
import torch

vocoder = None

def init_vocoder():
    global vocoder
    vocoder = torch.load("vocoder.pt", map_location="cpu", weights_only=True)

def synthesize(chunks):
    out = []
    for chunk in chunks:
        if vocoder == None:
            init_vocoder()
        out.append(vocoder(chunk))
    return out
"""


def test_a_load_under_an_equals_none_test_in_a_loop_runs_once() -> None:
    assert _lines(LAZY_IN_A_LOOP, "TPL403") == []


def test_a_load_in_a_loop_without_the_test_is_reported() -> None:
    eager = LAZY_IN_A_LOOP.replace(
        "        if vocoder == None:\n            init_vocoder()", "        init_vocoder()"
    )
    assert _lines(eager, "TPL403") == [12]


PICKER = """\
import gradio as gr
import torch

def change_gpt_weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)

def change_image(path):
    return torch.load(path, map_location="cpu", weights_only=True)

with gr.Blocks() as app:
    gr.Dropdown([]).change(change_gpt_weights, [], [])
    gr.Image().change(change_image, [], [])
"""


def test_a_model_pickers_handler_loads_the_model_picked() -> None:
    assert _lines(PICKER, "TPL403") == [8]


TRAIN_THEN_MOVE = """\
import torch
from torch import nn

def main(device):
    net = nn.Linear(4, 4)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    net.train().to(device)
    for _ in range(3):
        net(torch.randn(2, 4, device=device)).sum().backward()
        opt.step()
"""


def test_a_move_after_a_mode_setting_moves_the_model() -> None:
    assert _lines(TRAIN_THEN_MOVE, "TPL801") == [6]


LOSSES = """\
from torch import nn

class PixLoss(nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.plain = {"bce": nn.BCELoss(), "mae": nn.L1Loss(), "ce": nn.CrossEntropyLoss()}
        self.weighted = {"ce": nn.CrossEntropyLoss(weight=weight)}
        self.positional = [nn.NLLLoss(weight)]

    def forward(self, pred, gt):
        return sum(f(pred, gt) for f in [*self.plain.values(), *self.weighted.values()])
"""


def test_losses_without_class_weights_hold_nothing_in_a_plain_container() -> None:
    assert _lines(LOSSES, "TPL501") == [7, 8]


MEMBERSHIP = """\
import torch

def decode(model, x, eos, device, steps, output_name):
    model = model.to(device)
    y = torch.zeros(1, 1, dtype=torch.long, device=device)
    for _ in range(steps):
        outputs = model(x, y)
        if output_name not in outputs:
            break
        samples = torch.argmax(outputs["logits"], dim=-1)
        if eos in samples[:, 0]:
            break
        y = torch.cat([y, samples], dim=1)
    return y
"""


def test_membership_in_a_device_tensor_reads_it_back_a_key_in_a_mapping_does_not() -> None:
    assert _lines(MEMBERSHIP, "TPL201") == [11]


KERNEL = """\
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

class Ternary(nn.Module):
    def __init__(self, alpha: float = 0.5):
        super().__init__()
        w = np.eye(49).reshape((7, 7, 1, 49))
        self.w = torch.tensor(w).float().to(device)
        a = np.float32(alpha)
        self.alpha = torch.tensor(a).float().to(device)

    def forward(self, img):
        return F.conv2d(img, self.w, padding=3) * self.alpha
"""


def test_a_tensor_of_a_numpy_array_built_from_a_shape_is_kept_as_a_plain_attribute() -> None:
    assert _lines(KERNEL, "TPL501") == [12]


CHOSEN_LOAD = """\
import torch

def load(p):
    return torch.load(p, weights_only=True) if torch.cuda.is_available() else torch.load(p, map_location="cpu", weights_only=True)

def load_by_flag(p, use):
    return torch.load(p, weights_only=True) if use else torch.load(p, map_location="cpu", weights_only=True)
"""


def test_the_cuda_arm_of_a_conditional_load_runs_only_where_cuda_is() -> None:
    assert _lines(CHOSEN_LOAD, "TPL401") == [7]


ACCELERATE = """\
import torch
from accelerate import Accelerator

def main(cfg):
    accelerator = Accelerator(gradient_accumulation_steps=cfg.steps)
    vae = build_vae().to("cuda", dtype=torch.float16)
    net = build_net()
    net, opt = accelerator.prepare(net, torch.optim.AdamW(net.parameters()))
"""


def test_a_bare_cuda_placement_in_an_accelerate_script_is_multi_rank() -> None:
    assert _lines(ACCELERATE, "TPL104") == [6]
    assert _lines(ACCELERATE.replace("Accelerator(", "Settings("), "TPL104") == []


ANOMALY = """\
import torch

def train(model, loader, opt, device):
    model = model.to(device)
    for x in loader:
        out = model(x.to(device))
        if torch.is_anomaly_enabled():
            assert torch.all(torch.isfinite(out))
        out.sum().backward()
        opt.step()
"""


def test_a_check_under_autograds_anomaly_mode_runs_only_when_debugging() -> None:
    assert _lines(ANOMALY, "TPL201") == []
    assert _lines(ANOMALY.replace("if torch.is_anomaly_enabled():", "if True:"), "TPL201") == [8]


SWAPS = """\
import torch
from torch import nn

class ControlLDM(nn.Module):
    def __init__(self):
        super().__init__()
        self.control_model = nn.Linear(4, 4)
        self.diffusion_model = nn.Linear(4, 4)

    def low_vram_shift(self, is_diffusing):
        if is_diffusing:
            self.control_model = self.control_model.cuda()
        else:
            self.control_model = self.control_model.cpu()

    def shift(self):
        self.diffusion_model = self.diffusion_model.cuda()

    def to_ddp(self):
        self.diffusion_model = self.diffusion_model.cuda()

    def _batch_shuffle_ddp(self, x):
        return x[torch.randperm(x.shape[0]).cuda()]
"""


def test_a_method_named_for_gpu_memory_or_for_wrapping_per_rank_places_on_purpose() -> None:
    assert _lines(SWAPS, "TPL102") == [17, 23]


ANY_NAN = """\
import torch

def train(G, D, loader, opt, device):
    G, D = G.to(device), D.to(device)
    for x in loader:
        g_loss = G(x.to(device)).mean()
        d_loss = D(x.to(device)).mean()
        if any(torch.isnan(l) for l in (g_loss, d_loss)):
            raise ValueError("nan")
        if any(k.startswith("lr") for k in ("lr", "wd")):
            pass
        (g_loss + d_loss).backward()
        opt.step()
"""


def test_any_over_a_torch_test_of_listed_device_tensors_reads_each() -> None:
    assert _lines(ANY_NAN, "TPL201") == [8]


LIBRARY_OPTIMIZER = """\
import torch
from torch import nn
from adabelief_pytorch import AdaBelief
from transformers.optimization import Adafactor
from schedulers import Warmup

class Trainer:
    def __init__(self, rank):
        self.G = nn.Linear(4, 4)
        self.G_opt = AdaBelief(self.G.parameters(), lr=1e-4)
        self.G_ada = Adafactor(self.G.parameters(), lr=1e-4)
        self.G_warm = Warmup(self.G.parameters(), steps=10)
        self.cuda(rank)
"""


def test_another_librarys_optimizer_built_before_the_move() -> None:
    assert _lines(LIBRARY_OPTIMIZER, "TPL801") == [10, 11]


PADDED = """\
import torch

def add_tensors_with_padding(tensor1, tensor2):
    new_shape = tuple(max(a, b) for a, b in zip(tensor1.shape, tensor2.shape))
    padded = torch.zeros(new_shape)
    padded[tuple(slice(0, s) for s in tensor1.shape)] = tensor1
    return padded + tensor2

def add_arrays_with_padding(a1, a2):
    new_shape = tuple(max(a, b) for a, b in zip(a1.shape, a2.shape))
    padded = torch.zeros(new_shape)
    padded[tuple(slice(0, s) for s in a1.shape)] = a1
    return padded + a2
"""


def test_a_parameter_named_for_a_tensor_is_one() -> None:
    assert _lines(PADDED, "TPL103") == [5]


RANK_PLACED = """\
import torch

def main(gpu, cfg):
    model = build_model(cfg).to(cfg.rank)
    torch.cuda.set_device(gpu)
    return model
"""


def test_a_model_placed_on_a_rank_is_cuda_only_code() -> None:
    assert _lines(RANK_PLACED, "TPL601") == []
    assert _lines(RANK_PLACED.replace("cfg.rank", "cfg.device"), "TPL601") == [5]


SAVED_BY_HELPER = """\
import torch
import misc

def train(model, args, model_name):
    misc.save_on_master(model.state_dict(), args.output + model_name)
    state = torch.load(args.output + model_name)
    other = torch.load(args.output + "other.pth")
    return state, other
"""


def test_a_load_of_what_a_save_helper_wrote_above_is_a_round_trip() -> None:
    assert _lines(SAVED_BY_HELPER, "TPL401") == [7]


WARM_UP = """\
import time
import torch

def run_benchmark(fn, n_warmup, n_repeat):
    times = []
    for _ in range(n_warmup):
        fn()
        torch.cuda.synchronize()
    for _ in range(n_repeat):
        torch.cuda.synchronize()
        began = time.time()
        fn()
        torch.cuda.synchronize()
        times.append(time.time() - began)
    return times

def train(step, n):
    for _ in range(n):
        step()
        torch.cuda.synchronize()
"""


def test_the_warm_up_of_a_loop_that_times_each_step_synchronises_as_it_does() -> None:
    assert _lines(WARM_UP, "TPL202") == [20]


ASKS = """\
import torch

def pick_placeholder(tokenizer, device):
    while True:
        text = input("Enter a placeholder string: ")
        tokens = tokenizer(text).to(device)
        if torch.count_nonzero(tokens) == 3:
            return tokens[0, 1]

def first_single_token(tokenizer, texts, device):
    for text in texts:
        tokens = tokenizer(text).to(device)
        if torch.count_nonzero(tokens) == 3:
            return tokens[0, 1]
"""


def test_a_loop_paced_by_a_person_typing_is_not_a_batch_loop() -> None:
    assert _lines(ASKS, "TPL201") == [13]
