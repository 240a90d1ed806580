"""Rule behaviour found on code the corpus did not hold yet (an eighth round of repositories):
generation hooks (TPL201), mappings moved but for some keys, lazy caches of an instance,
submodules of a CPU-only script (TPL103), backend names kept on ``self`` (TPL104), and
data-dependent shapes in a timed region (TPL301)."""

from __future__ import annotations

import pytest

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL201: a stopping criterion runs once per generated token

STOPPING = """\
import torch
from transformers import StoppingCriteria


class StopOnTokens(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        for stop_id in [2]:
            if input_ids[0][-1] == stop_id:
                return True
        return False


class StopOnWords(StoppingCriteria):
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor):
        return bool(torch.all(input_ids[:, -2:] == 7).item())


class ByLength(StoppingCriteria):
    def __call__(self, input_ids, scores):
        return input_ids.shape[-1] > 10


class Grammar(LogitsProcessor):
    def __call__(self, logits: torch.Tensor, states: list[int]):
        for i in range(logits.shape[0]):
            if states[i] == -1:
                continue
        return logits
"""


def test_a_stopping_criterion_reads_the_device_ids_once_per_token() -> None:
    assert _lines(STOPPING, "TPL201") == [8, 15]


def test_a_plain_class_with_the_same_call_is_not_a_generation_hook() -> None:
    plain = STOPPING.replace("(StoppingCriteria)", "").replace("(LogitsProcessor)", "")
    assert _lines(plain, "TPL201") == []


# ---- TPL201: a loop that moves a mapping's items but for some keys

SKIPPED_KEY = """\
def run(model, loader, opt):
    for batch in loader:
        for k in batch:
            if k != "meta":
                batch[k] = batch[k].to(device=opt.device, non_blocking=True)
        out = model(batch["input"])
        centers = batch["meta"]["c"].cpu().numpy()
        inputs = batch["input"].cpu().numpy()
        print(centers, inputs)
"""


def test_the_key_a_moving_loop_skips_stays_on_the_host() -> None:
    assert _lines(SKIPPED_KEY, "TPL201") == [8]


def test_keys_skipped_with_continue_stay_on_the_host() -> None:
    skipped = SKIPPED_KEY.replace(
        '            if k != "meta":\n                batch[k]',
        '            if k in ("meta", "id"):\n                continue\n            batch[k]',
    )
    assert _lines(skipped, "TPL201") == [9]


def test_without_the_guard_every_item_is_on_the_device() -> None:
    unguarded = SKIPPED_KEY.replace('            if k != "meta":\n    ', "        ")
    assert _lines(unguarded, "TPL201") == [6, 7]


# ---- TPL201: an instance's lazy cache, filled once

LAZY = """\
import numpy as np
import torch


def exists(val):
    return val is not None


class Trainer:
    def __init__(self):
        self.av = None

    def truncate(self, S, t):
        if not exists(self.av):
            z = torch.randn(2000, 8, device="cuda")
            self.av = np.mean(S(z).cpu().numpy(), axis=0)
        return t - torch.from_numpy(self.av).cuda()

    def sample(self, S, loader):
        for t in loader:
            self.truncate(S, t.cuda())
"""


def test_an_attribute_filled_once_by_the_branch_that_finds_it_unset_is_read_once() -> None:
    assert _lines(LAZY, "TPL201") == []


def test_a_cache_another_method_unsets_is_read_again() -> None:
    reset = LAZY + "\n    def step(self):\n        self.av = None\n"
    assert _lines(reset, "TPL201") == [16]


# ---- TPL103: the submodules a CPU-only script's model builds

CPU_SCRIPT = """\
import torch
import torch.nn as nn


class Encoder(nn.Module):
    def forward(self, x):
        return x + torch.arange(x.size(1))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x):
        return self.encoder(x)


if __name__ == "__main__":
    model = Transformer()
    opt = torch.optim.Adam(model.parameters())
    loss = model(torch.zeros(2, 3)).sum()
    loss.backward()
    opt.step()
"""


def test_a_submodule_built_by_a_cpu_only_script_model_stays_on_the_cpu() -> None:
    assert _lines(CPU_SCRIPT, "TPL103") == []


def test_the_submodule_is_checked_once_the_script_names_a_device() -> None:
    moved = CPU_SCRIPT.replace("model = Transformer()", "model = Transformer().cuda()")
    assert _lines(moved, "TPL103") == [7]


# ---- TPL104: a default compared, through `self`, as a backend name

PREFETCH = """\
import torch


class PrefetchLoader:
    def __init__(self, loader, device="cuda"):
        self.loader = loader
        self.mean = torch.tensor([0.5]).to(device)
        self.device = device

    def __iter__(self):
        for x in self.loader:
            if self.device == "cuda":
                x = x.cuda(non_blocking=True)
            yield x


def create_loader(loader, device="cuda"):
    return PrefetchLoader(loader, device=device)
"""


def test_a_default_the_class_compares_as_a_name_is_a_backend_name() -> None:
    assert _lines(PREFETCH, "TPL104") == []


def test_the_default_is_reported_when_nothing_compares_it() -> None:
    placed = PREFETCH.replace('if self.device == "cuda":', "if True:")
    assert _lines(placed, "TPL104") == [5, 17]


# ---- TPL301: a boolean mask's result is sized by the values

MASKED = """\
import time


def evaluate(model, loader):
    model = model.cuda()
    for batch in loader:
        t = time.time()
        out = model(batch["input"].cuda())
        out = out[batch["mask"].cuda() > 0]
        print(time.time() - t)
"""


def test_indexing_by_a_device_mask_waits_for_the_device() -> None:
    assert _lines(MASKED, "TPL301") == []


def test_without_the_mask_the_timing_measures_the_launch() -> None:
    unmasked = MASKED.replace('out = out[batch["mask"].cuda() > 0]', "out = out + 1")
    assert _lines(unmasked, "TPL301") == [7]


# ---- TPL801: parameters joined into a list first, the optimizer class imported by name

JOINED_PARAMS = """\
from torch.optim import Adam


class Trainer:
    def init(self, rank):
        generator_params = list(self.G.parameters()) + list(self.S.parameters())
        self.G_opt = Adam(generator_params, lr=1e-3)
        self.cuda(rank)
        self.G_opt.step()
"""


def test_a_list_of_parameters_joined_before_the_move() -> None:
    assert _lines(JOINED_PARAMS, "TPL801") == [7]


def test_the_same_list_after_the_move_is_fine() -> None:
    moved = JOINED_PARAMS.replace("        self.cuda(rank)\n", "").replace(
        "    def init(self, rank):\n", "    def init(self, rank):\n        self.cuda(rank)\n"
    )
    assert _lines(moved, "TPL801") == []


# ---- TPL201: each name of `a, b = x, y` takes its own element

PAIRED = """\
def embed(model, loader):
    kept = []
    for batch in loader:
        out = model(batch["input"].cuda())
        ids = batch["ids"].cuda()
        for i in range(out.shape[0]):
            feat, label = out[i], ids[i].long()
            if label != -1:
                kept.append(feat)
"""


def test_an_unpacked_display_gives_each_name_its_element() -> None:
    assert _lines(PAIRED, "TPL201") == [8]


def test_a_host_element_beside_a_device_one_stays_on_the_host() -> None:
    host = PAIRED.replace("feat, label = out[i], ids[i].long()", "feat, label = out[i], 3")
    assert _lines(host, "TPL201") == []


# ---- TPL201: a Python lookup table indexed by a device element

TABLE = """\
def decode(model, loader, vocab, device):
    for batch in loader:
        ids = model(batch.to(device)).argmax(-1)
        for row in ids:
            print(" ".join(vocab.itos[i] for i in row))
        names = [vocab.itos[i] for i in range(3)]
        host = ids.cpu()
        words = [vocab.itos[i] for i in host[0]]
        print(names, words)
"""


def test_a_vocabulary_indexed_by_device_ids_reads_each_id() -> None:
    assert _lines(TABLE, "TPL201") == [5, 7]


# ---- TPL501: `nn` from a star import of a module of the tree

STAR = """\
import torch
from common import *


class Detect(nn.Module):
    def __init__(self, nl):
        super().__init__()
        self.grid = [torch.zeros(1)] * nl
        self.anchor = torch.zeros(3, 2)

    def forward(self, x):
        return x * self.anchor + self.grid[0]
"""


def test_a_module_class_whose_nn_comes_from_a_star_import() -> None:
    assert _lines(STAR, "TPL501") == [8, 9]


# ---- TPL201: Lightning 1.x's `*_step_end` hooks run once per batch

STEP_END = """\
import pytorch_lightning as pl


class Module(pl.LightningModule):
    def validation_step_end(self, val_logs):
        for i, fname in enumerate(val_logs["fname"]):
            output = val_logs["output"][i].cpu().numpy()
            print(fname, output)

    def validation_epoch_end(self, outputs):
        for out in outputs:
            print(out["output"].cpu().numpy())
"""


def test_a_step_end_hook_reads_what_the_step_returned_every_batch() -> None:
    assert _lines(STEP_END, "TPL201") == [7]


# ---- TPL201: an optimizer's own `step` runs once per training step

LARS = """\
import torch
from torch.optim.optimizer import Optimizer


class LARS(Optimizer):
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                one = torch.Tensor([1.0]).to(p.device)
                trust = torch.where(p.norm() > 0, p.grad.norm(), one).item()
                p.data.add_(p.grad, alpha=-group["lr"] * trust)
"""


def test_a_read_in_an_optimizer_step_runs_every_training_step() -> None:
    assert _lines(LARS, "TPL201") == [12]


def test_the_same_method_of_another_class_is_not_a_step() -> None:
    assert _lines(LARS.replace("LARS(Optimizer)", "LARS(object)"), "TPL201") == []


# ---- TPL201: a warning taken only for a value out of its range

RANGE = """\
import torch


def mel(y):
    if torch.min(y) < -1.1:
        print("min value is ", torch.min(y))
    if y.max() > 1.1:
        y = y / y.max().item()
    return y


def train(model, loader):
    model.cuda()
    for x in loader:
        mel(model(x.cuda()))
"""


def test_a_print_for_a_value_out_of_range_runs_rarely() -> None:
    assert _lines(RANGE, "TPL201") == [5, 7, 8]


# ---- TPL201: host copies joined, reshaped and handed to the call whose result is returned

JOINED = """\
import numpy as np
import torch
import utils


class Reader:
    def __init__(self, device):
        self.device = device
        self.net = Net().to(device)

    def extract(self, audio):
        bits = []
        for n in range(2):
            signal = torch.FloatTensor(audio[n]).to(self.device)
            bits.append((self.net(signal) >= 0.5).int().cpu().numpy())
        bits = np.stack(bits).reshape(-1, 8)
        return utils.bits_to_string(bits)
"""


def test_copies_reshaped_into_the_returned_answer_are_the_output() -> None:
    assert _lines(JOINED, "TPL201") == []


def test_copies_scored_instead_are_reported() -> None:
    scored = JOINED.replace("utils.bits_to_string(bits)", "utils.f1_score(bits)")
    assert _lines(scored, "TPL201") == [15]


# ---- TPL103: a torch reduction of a host factory read back by a test

REDUCED = """\
import torch
from torch import nn


class Up(nn.Module):
    def forward(self, x):
        padding = [0, 0, 0, 0]
        if torch.sum(torch.tensor(padding)) != 0:
            x = nn.functional.pad(x, padding)
        return x + torch.tensor([1.0, 2.0])
"""


def test_a_reduction_of_a_host_factory_in_a_test_stays_on_the_host() -> None:
    assert _lines(REDUCED, "TPL103") == [10]


# ---- TPL501: a factory filled in place and element by element, returned by a method

FILLED_MASK = """\
import torch
import torch.nn as nn


class NTXent(nn.Module):
    def __init__(self, batch_size):
        super().__init__()
        self.mask = self.correlated(batch_size)

    def correlated(self, batch_size):
        mask = torch.ones((2 * batch_size, 2 * batch_size), dtype=bool)
        mask = mask.fill_diagonal_(0)
        for i in range(batch_size):
            mask[i, batch_size + i] = 0
        return mask

    def forward(self, sim):
        return sim[self.mask]
"""


def test_a_mask_filled_in_place_is_still_the_factory_tensor() -> None:
    assert _lines(FILLED_MASK, "TPL501") == [8]


def test_the_same_mask_registered_is_fine() -> None:
    registered = FILLED_MASK.replace(
        "self.mask = self.correlated(batch_size)",
        'self.register_buffer("mask", self.correlated(batch_size))',
    )
    assert _lines(registered, "TPL501") == []


# ---- TPL201: an element of a device tensor as a bound of `narrow`

NARROW = """\
def generate(model, loader, device, results):
    for batch in loader:
        out = model(batch.to(device))
        ends = (out > 0).sum(1)
        rows = [out[i].narrow(0, 0, n) for i, n in enumerate(ends)]
        fixed = [out[i].narrow(0, 0, 4) for i in range(len(rows))]
        sizes = ends.tolist()
        kept = [out[i].narrow(0, 0, n) for i, n in enumerate(sizes)]
        results.append((fixed, kept))
"""


def test_a_narrow_bound_from_a_device_tensor_reads_each_row() -> None:
    assert _lines(NARROW, "TPL201") == [5, 7]


# ---- TPL201: a number grown by tensors, then compared

GROWN = """\
def generate(model, loader, device):
    steps = 0
    total = 0
    for x in loader:
        logits = model(x.to(device))
        steps += (logits.argmax(-1) != 0).any().int()
        total += logits.sum().item()
        if steps > 0:
            print("streaming")
        if total > 10:
            break
"""


def test_a_count_grown_by_device_values_is_read_by_its_test() -> None:
    assert _lines(GROWN, "TPL201") == [7, 8]


# ---- TPL104: a command line's default, as an argparse default is

FIRE = """\
import fire
import torch


def run(checkpoint, device="cuda"):
    return torch.load(checkpoint, map_location=device, weights_only=True).to(device)


def helper(x, device="cuda"):
    return x.to(device)


if __name__ == "__main__":
    fire.Fire(run)
"""

CLICK = """\
import click
import torch


@click.command()
@click.option("--steps", default=1)
def main(steps, device=torch.device("cuda")):
    return torch.zeros(steps).to(device)
"""


def test_a_fire_entry_point_default_is_a_flag_default() -> None:
    assert _lines(FIRE, "TPL104") == [9]


def test_a_click_command_parameter_no_option_sets_is_reported() -> None:
    assert _lines(CLICK, "TPL104") == [7]
    flagged = CLICK.replace('@click.option("--steps", default=1)', '@click.option("--device")')
    assert _lines(flagged, "TPL104") == []


# ---- TPL201: branches chosen by a setting's name, and saved every N steps

SETTINGS = """\
import torch


def save_progress(encoder, path):
    torch.save(encoder.weight.detach().cpu(), path)


def train(self, encoder, loader, optimizer, args):
    encoder.cuda()
    last_save = 0
    for step, batch in enumerate(loader):
        loss = encoder(batch.cuda()).mean()
        loss.backward()
        optimizer.step()
        if self.logger == "tensorboard" and self.accelerator.is_main_process:
            self.writer.add_scalar("loss", loss.item(), step)
        if args.save_steps and step - last_save >= args.save_steps:
            if self.accelerator.is_main_process:
                save_progress(encoder, "x.pt")
                last_save = step
"""


def test_a_backend_chosen_by_name_logs_on_every_step() -> None:
    assert _lines(SETTINGS, "TPL201") == [16]


# ---- TPL201: a model run on each row, each written out as its own file

PER_ROW = """\
import torchaudio


def vocode(model, vocoder, loader, device):
    for batch in loader:
        mels = model(batch.to(device))
        for i, mel in enumerate(mels):
            wave = vocoder(mel[None]).squeeze(0).cpu()
            torchaudio.save(f"{i}.wav", wave, 24000)
            row = mel.cpu()
            torchaudio.save(f"{i}.mel.wav", row, 24000)
"""


def test_a_row_a_model_ran_on_written_as_its_file_is_the_output() -> None:
    assert _lines(PER_ROW, "TPL201") == [10]


# ---- TPL201: each pass's copy summed into a host array (a multi-scale test)

SCALES = """\
import numpy as np
import torch


def detect(model, img):
    heat = np.zeros(img.shape)
    total = 0
    for scale in [x * 368 / img.shape[0] for x in (0.5, 1.0)]:
        out = model(torch.from_numpy(img * scale).cuda())
        h = out.cpu().numpy()
        h = np.transpose(np.squeeze(h), (1, 2, 0))
        heat += h / 2
        loss = out.mean().cpu().numpy()
        total += loss
    return heat, total
"""


def test_copies_summed_into_a_host_array_fill_it() -> None:
    assert _lines(SCALES, "TPL201") == [13]


# ---- TPL501: a parameter appended through `requires_grad_`

APPENDED = """\
import torch
import torch.nn as nn


class KAN(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.node_bias = []
        for d in dims:
            self.node_bias.append(nn.Parameter(torch.zeros(d)).requires_grad_(True))
"""


def test_a_parameter_set_trainable_in_a_plain_list() -> None:
    assert _lines(APPENDED, "TPL501") == [10]


# ---- TPL201: `torch.tensor` of a display of a device element, repeated

REPEATED = """\
import torch


def prune(model, loader, device, arity):
    for x in loader:
        scores = model(x.to(device))
        active = scores[0] > 0.5
        mask = torch.tensor([active] * arity).to(device)
        ones = torch.tensor([1.0] * arity).to(device)
        yield mask * ones
"""


def test_a_repeated_display_of_a_device_element_is_read_element_by_element() -> None:
    assert _lines(REPEATED, "TPL201") == [8]


# ---- TPL701: a non-blocking copy_ of an unpinned batch into a device buffer

COPY_INTO = """\
import torch
from torch.utils.data import DataLoader


def run(ds, device):
    buf = torch.empty(8, 3, 224, 224, device=device)
    for batch in DataLoader(ds, batch_size=8):
        buf[: batch.size(0)].copy_(batch, non_blocking=True)
    for batch in DataLoader(ds, batch_size=8, pin_memory=True):
        buf[: batch.size(0)].copy_(batch, non_blocking=True)
"""


def test_a_copy_into_a_device_buffer_from_an_unpinned_loader() -> None:
    assert _lines(COPY_INTO, "TPL701") == [8]


# ---- TPL104: an attribute of a model holder bound to bare "cuda" and placing with it

HOLDER = """\
class Sampler:
    def __init__(self, model_id):
        self.device = "cuda"
        self.model = UNet.from_pretrained(model_id).to(self.device)


class Chooser:
    def __init__(self, model):
        self.model = model
        self.device = "cuda"

    def run(self, x):
        if self.device == "cuda":
            return self.model(x)
"""


def test_a_model_holder_attribute_bound_to_bare_cuda() -> None:
    assert _lines(HOLDER, "TPL104") == [3]


# ---- TPL201: a run's setting that picks where it reports is on for the whole run

WANDB = """\
import wandb


def train(args, model, loader, optimizer):
    model.cuda()
    for step, batch in enumerate(loader):
        loss = model(batch.cuda()).mean()
        loss.backward()
        optimizer.step()
        if args.rank == 0 and args.report_to_wandb:
            wandb.log({"loss": loss.item()})
        if args.verbose:
            print(loss.item())
"""


def test_a_reporting_backend_setting_logs_every_step() -> None:
    assert _lines(WANDB, "TPL201") == [11]


# ---- TPL301: a copy to a name bound only to the CPU waits for the device

CPU_NAME = """\
import time
import torch


def evaluate(model, loader, device):
    cpu_device = torch.device("cpu")
    model.to(device)
    for images in loader:
        images = images.to(device)
        torch.cuda.synchronize()
        start = time.time()
        outputs = model(images)
        outputs = [{k: v.to(cpu_device) for k, v in t.items()} for t in outputs]
        print(time.time() - start)
"""


def test_a_copy_to_a_cpu_name_ends_the_timed_work() -> None:
    assert _lines(CPU_NAME, "TPL301") == []
    unsynced = CPU_NAME.replace("v.to(cpu_device)", "v.to(cpu_device, non_blocking=True)")
    assert _lines(unsynced, "TPL301") == [11]


# ---- TPL402: a buffer built over given bytes and rewound is not a round trip

REWOUND = """\
import io
import torch


def load_remote(content):
    buf = io.BytesIO(content)
    buf.seek(0)
    return torch.load(buf, map_location="cpu")


def round_trip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, map_location="cpu")
"""


def test_bytes_from_elsewhere_rewound_are_still_untrusted() -> None:
    assert _lines(REWOUND, "TPL402") == [8]


# ---- every rule: statements after a return never run

DEAD = """\
import torch


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)
    state = torch.load(path)
    return state
"""


def test_statements_after_a_return_are_not_checked() -> None:
    assert _lines(DEAD, "TPL401") == []
    assert _lines(DEAD, "TPL402") == []
    alive = DEAD.replace('    return torch.load(path, map_location="cpu", weights_only=True)\n', "")
    assert _lines(alive, "TPL401") == [5]


# ---- TPL201: a helper of a sibling module called by the alias it is imported under

METRICS = """\
def accuracy_sbm(scores, targets):
    return (scores.argmax(1) == targets).float().sum().item()
"""

TRAIN = """\
from train.metrics import accuracy_sbm as accuracy


def train_epoch(model, optimizer, device, loader):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        scores = model(x)
        (scores - y).pow(2).mean().backward()
        optimizer.step()
        accuracy(scores, y)
"""


def test_a_helper_called_by_its_import_alias_runs_per_batch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = {"train/__init__.py": "", "train/metrics.py": METRICS, "train/loop.py": TRAIN}
    found = _project(tmp_path_factory.mktemp("p"), files, "TPL201")
    assert found == [("train/metrics.py", 2)]


# ---- TPL201: a module's forward called by its name

FORWARD_NAMED = """\
import torch
import torch.nn as nn


class Net(nn.Module):
    def forward(self, x, edges):
        srcs = edges[0]
        return torch.stack([x[srcs[i].item()] for i in range(len(srcs))])


def train(model, loader, device, optimizer):
    for x, edges in loader:
        out = model.forward(x.to(device), edges.to(device))
        out.sum().backward()
        optimizer.step()


def main(device):
    model = Net().to(device)
    train(model, [], device, None)
"""


def test_forward_called_by_name_runs_per_batch() -> None:
    assert _lines(FORWARD_NAMED, "TPL201") == [8]


# ---- TPL201: a helper called after `if steps % every: return` in a step method

GUARDED = """\
import torch


class Trainer:
    def __init__(self, model):
        self.model = model.cuda()
        self.steps = torch.zeros(1, device="cuda")

    def save(self, path):
        torch.save({"steps": self.steps.cpu()}, path)

    def update(self, batch):
        loss = self.model(batch.cuda()).mean()
        loss.backward()
        self.optimizer.step()
        total = int(self.steps.sum().item())
        if total % self.checkpoint_every:
            return
        self.save("x.pt")


def fit(trainer, loader):
    for batch in loader:
        trainer.update(batch)
"""


def test_a_helper_after_a_remainder_guard_runs_once_in_n_steps() -> None:
    assert _lines(GUARDED, "TPL201") == [16]


# ---- TPL102 and TPL201: an autograd Function's forward and backward are a model's own op

SHAKE = """\
import torch
from torch.autograd import Function


class ShakeDrop(Function):
    @staticmethod
    def forward(ctx, x, p_drop=0.5, slope=10.0):
        gate = torch.cuda.FloatTensor([0]).bernoulli_(1 - p_drop)
        ctx.save_for_backward(gate, torch.tensor(slope))
        if gate.item() == 0:
            return x * 0
        return x

    @staticmethod
    def backward(ctx, grad_output):
        beta = torch.cuda.FloatTensor(grad_output.size(0)).uniform_(0, 1)
        return grad_output * beta, None, None
"""


def test_cuda_constructors_in_an_autograd_function_are_a_modules() -> None:
    assert _lines(SHAKE, "TPL102") == [8, 16]
    assert _lines(SHAKE, "TPL103") == []


def test_a_read_in_an_autograd_function_runs_each_time_it_is_applied() -> None:
    assert _lines(SHAKE, "TPL201") == [10]
    plain = SHAKE.replace("(Function)", "(object)")
    assert _lines(plain, "TPL102") == []


# ---- TPL101: a tensor attribute moved by a statement, its copy discarded

ATTRIBUTES = """\
import torch
import torch.nn as nn


class Alias(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.probs = None
        self.probs = torch.zeros(k)
        self.pos = nn.Parameter(torch.zeros(4, 4))
        self.lin = nn.Linear(4, 4)

    def draw(self, device):
        self.probs.to(device)
        self.pos.to(torch.float16)
        self.lin.to(device)
"""


def test_a_discarded_move_of_a_tensor_attribute() -> None:
    assert _lines(ATTRIBUTES, "TPL101") == [14, 15]


def test_a_parameter_attribute_gets_no_fix_that_would_replace_it() -> None:
    from torchplace.lint import lint_source

    fixes = {f.line: f.fix for f in lint_source(ATTRIBUTES, path="m.py") if f.code == "TPL101"}
    assert fixes[14] is not None
    assert fixes[15] is None


# ---- TPL701: a tokenizer's tensors are built on the host, never pinned

TOKENIZED = """\
class Model:
    def encode(self, texts):
        encodings = self.tokenizer(texts, padding="longest", return_tensors="pt")
        input_ids, attention_mask = encodings["input_ids"], encodings["attention_mask"]
        input_ids = input_ids.to(self.device, non_blocking=True)
        pinned = self.tokenizer(texts, return_tensors="pt")["input_ids"].pin_memory()
        pinned = pinned.to(self.device, non_blocking=True)
        return input_ids, attention_mask, pinned
"""


def test_a_non_blocking_copy_of_tokenizer_output() -> None:
    assert _lines(TOKENIZED, "TPL701") == [5]
