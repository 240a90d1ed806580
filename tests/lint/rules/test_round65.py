"""Round 65: counts of a data-dependent result, a tensor `clamp` bound beside a number and a
device tensor as a fill value, all made Python numbers on the host; reads under a debugging
setting; a module derived from one of its own file; `.to("cpu")` in a chain of reads (TPL201)."""

from __future__ import annotations

from pathlib import Path

from torchplace.lint import project as project_module

from .helpers import lines as _lines
from .helpers import project as _project

UNIQUE = """\
import numpy as np
import torch

def train(model, loader, opt, device):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        codes = model(x)
        used = codes.unique().numel()
        kinds = len(torch.unique(y))
        runs = torch.unique_consecutive(y).size(0)
        host = len(np.unique(y.shape))
        same = codes.numel()
        loss = codes.float().mean()
        loss.backward()
        opt.step()
"""


def test_the_size_of_unique_is_read_on_the_host() -> None:
    # NumPy's unique of a host tuple, and the size of a tensor whose shape the host knows, are
    # no reads
    assert _lines(UNIQUE, "TPL201") == [8, 9, 10]


MASKED = """\
import torch

def train(model, loader, opt):
    for x, idx in loader:
        x, idx = x.cuda(), idx.cuda()
        select = model(x).max(1)[0].ge(0.9).long()
        if idx[select == 1].nelement() != 0:
            pass
        n = torch.nonzero(select).size(0)
        k = idx[:3].numel()
        m = idx[idx.long()].numel()
        model(x).sum().backward()
        opt.step()
"""


def test_the_size_of_a_masked_selection_or_of_nonzero_is_read_on_the_host() -> None:
    # a slice's or an index tensor's selection has a size the host knows
    assert _lines(MASKED, "TPL201") == [7, 9]


def test_a_count_of_unique_after_the_loop_is_read_once() -> None:
    source = """\
import torch

def evaluate(model, loader, device):
    seen = []
    for x in loader:
        seen.append(model(x.to(device)).argmax(1))
    return torch.cat(seen).unique().numel()
"""
    assert _lines(source, "TPL201") == []


CLAMP = """\
import torch

def train(model, loader, device, limit):
    for x, dims in loader:
        x, dims = x.to(device), dims.to(device)
        out = model(x)
        a = torch.clamp(out, 0.0, dims[0])
        b = out.clamp_(min=-1, max=x.amax())
        c = out.clamp(0, 1)
        d = out.clamp(max=x.max())
        e = out.clamp(x.min(), x.max())
        f = out.clamp(0, limit)
        g = out.clip(0, dims[1] - 1)
        out.sum().backward()
"""


def test_a_tensor_clamp_bound_beside_a_number_is_read() -> None:
    # a tensor bound alone, or both bounds tensors, keep the tensor overload on the device; a
    # bound of unknown kind is left alone
    assert _lines(CLAMP, "TPL201") == [7, 8, 13]


def test_numpy_clip_is_not_torch_clamp() -> None:
    source = """\
import numpy as np

def run(model, loader, device):
    for x in loader:
        y = model(x.to(device))
        z = np.clip(y, 0, y.max())
"""
    assert _lines(source, "TPL201") == []


FILL = """\
import torch

def train(model, loader, opt, device):
    for x in loader:
        x = x.to(device)
        m = x.max()
        a = torch.full((3,), m, device=x.device)
        b = torch.full((3,), torch.tensor(1.0, device=device), device=device)
        c = x.clone().fill_(m)
        d = torch.zeros(3).fill_(m)
        e = torch.full((3,), torch.finfo(x.dtype).min, device=device)
        f = x.new_full((3,), float("-inf"))
        model(x).sum().backward()
        opt.step()
"""


def test_a_whole_device_tensor_as_a_fill_value_is_read() -> None:
    # `fill_` copies a tensor of its own device on the device: a read only into a tensor made
    # on the host; a number, or a float made of a dtype's limits, is none
    assert _lines(FILL, "TPL201") == [7, 8, 10]


def test_a_read_under_a_debugging_setting_is_rare() -> None:
    source = """\
import torch

def train(model, loader, opt, device, debug_value=None, log_writer=None):
    for x in loader:
        x = x.to(device)
        if debug_value is not None:
            print(x.max().item())
        if log_writer is not None:
            log_writer.add(x.mean().item())
        model(x).sum().backward()
        opt.step()
"""
    assert _lines(source, "TPL201") == [9]


SUBCLASSED = """\
import torch
from torch import nn

class MultiHeadAttn(nn.Module):
    def forward(self, h, attn_mask=None):
        if attn_mask is not None and attn_mask.any().item():
            h = h.masked_fill(attn_mask, 0)
        return h

class RelMultiHeadAttn(MultiHeadAttn):
    pass

class RelPartialAttn(RelMultiHeadAttn):
    def forward(self, h, attn_mask=None):
        if attn_mask is not None and attn_mask.any().item():
            h = h.masked_fill(attn_mask, 0)
        return h
"""

RUNS = """\
def train(model, loader, opt):
    for x in loader:
        model(x).sum().backward()
        opt.step()
"""


def test_a_forward_of_a_module_derived_from_one_of_its_file_is_per_batch(tmp_path: Path) -> None:
    # the class two derivations from `nn.Module` through classes of its own file is a module
    assert _lint(tmp_path, {"attn.py": SUBCLASSED, "train.py": RUNS}) == [
        ("attn.py", 6),
        ("attn.py", 15),
    ]


def _lint(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    project_module._scan.cache_clear()
    project_module.project_root.cache_clear()
    return _project(root, {"setup.cfg": "", **files}, "TPL201")


TO_CPU = """\
import torch

def train(model, loader, opt, device):
    cpu = torch.device("cpu")
    for x in loader:
        x = x.to(device)
        loss = model(x).sum()
        loss.backward()
        opt.step()
        a = loss.to("cpu").numpy()
        b = loss.detach().to(device=cpu).item()
        c = loss.to("cpu", non_blocking=True).numpy()
        outputs = [o.to(cpu) for o in model(x)]
"""


def test_a_copy_to_the_cpu_by_to_then_read_is_one_read() -> None:
    # `.to("cpu")` alone is left to the rules on moves (detectors move result objects that
    # have no `.cpu()` so); a non-blocking copy reads nothing at once
    assert _lines(TO_CPU, "TPL201") == [10, 11]


LAMBDA_HELPER = """\
import numpy as np
import torch
import torch.nn.functional as F

to_np = lambda x: x.data.cpu().numpy()
to_list = lambda x: x.tolist()
scale_np = lambda x: x * 2

def train(net, loader, opt):
    for data, target in loader:
        data, target = data.cuda(), target.cuda()
        loss = F.cross_entropy(net(data), target)
        loss.backward()
        opt.step()
        l = to_np(loss)
        s = scale_np(loss)

def scores(net, loader):
    kept = []
    with torch.no_grad():
        for data, _ in loader:
            out = net(data.cuda())
            kept.append(to_np(out.max(1)[0]))
    return np.concatenate(kept).copy()
"""


def test_a_module_lambda_that_copies_its_argument_to_the_host_is_a_read() -> None:
    # a lambda that hands back something else is no copy; scores collected and returned (a
    # copy of the joined array) are the function's output
    assert _lines(LAMBDA_HELPER, "TPL201") == [15]


NCCL = """\
import logging
import torch
logger = logging.getLogger(__name__)

def main(args):
    if args.local_rank == -1:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
        torch.distributed.init_process_group(backend="nccl")

"""


def test_a_device_pick_a_few_set_up_lines_before_its_nccl_group_is_its_set_up() -> None:
    # (TPL601) a device named or a log line between them changes nothing; with no NCCL group
    # after them the pick is reported, as with real work between them
    assert _lines(NCCL, "TPL601") == []
    alone = NCCL.replace('        torch.distributed.init_process_group(backend="nccl")\n', "")
    assert _lines(alone, "TPL601") == [9]
    work = NCCL.replace("device = torch.device(", "model = build(")
    assert _lines(work, "TPL601") == [9]


OWN_OPTIMIZER = """\
from torch.optim import Optimizer

class OpenAIAdam(Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))
"""

BUILDS = """\
import torch
from torch import nn
from opt import OpenAIAdam

class Net(nn.Module):
    pass

def with_own(device):
    model = Net()
    opt = OpenAIAdam(model.parameters(), lr=1e-3)
    model.to(device)
    return opt

def wrapped():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model = nn.DataParallel(model).cuda()
    return opt

def wrapped_first():
    model = nn.DataParallel(Net()).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return opt
"""


def test_a_project_optimizer_and_a_move_through_a_data_parallel_wrapper(tmp_path: Path) -> None:
    # (TPL801) the project's optimizer class derives from torch.optim's; the wrapper built
    # around the model holds its parameters, moved with it
    found = _project(
        tmp_path, {"setup.cfg": "", "opt.py": OWN_OPTIMIZER, "train.py": BUILDS}, "TPL801"
    )
    assert found == [("train.py", 10), ("train.py", 16)]


MIXUP = """\
import torch

def train(model, loader, opt):
    for (x, y), (u, u2) in loader:
        x, y = x.cuda(), y.cuda(non_blocking=True)
        u, u2 = u.cuda(), u2.cuda()
        idx = torch.randperm(x.size(0))
        first = x[idx]
        every = torch.cat([x, u, u2], dim=0)
        mixed = every[torch.randperm(every.size(0))]
        host, kept = u.cpu(), torch.cat([u, host])
        other = kept[torch.randperm(4)]
        model(first + mixed).sum().backward()
        opt.step()
"""


def test_names_moved_by_a_tuple_assignment_and_their_joins_are_placed() -> None:
    # (TPL103) a join with a host value is not placed
    assert _lines(MIXUP, "TPL103") == [7, 10]


PASSES = """\
import numpy as np
import torch

def evaluate(loader, model, crops):
    scores = []
    for crop in range(crops):
        for i, (x, y) in enumerate(loader):
            out = model(x.cuda())
            if crop < 1:
                scores.append(torch.sum(out, 0).cpu().numpy())
            if i == 0:
                print(out.mean().item())
    return float(np.concatenate(scores).mean())
"""


def test_a_test_of_a_counter_of_a_loop_around_the_batch_loop_is_not_rare() -> None:
    # `crop < 1` holds on every step of the first pass; `i == 0` picks one step of each
    assert _lines(PASSES, "TPL201") == [10]


FILLED = """\
import torch
from torch import nn

class Decoder(nn.Module):
    def forward(self, x_rnn, x_lengths):
        N, T, n = x_rnn.size()
        for i in range(N):
            if x_lengths[i] < T:
                x_rnn[i, x_lengths[i]:, :] = torch.zeros(T - x_lengths[i], n, device=x_rnn.device)
        return x_rnn

def train(model, loader, opt):
    decoder = Decoder().cuda()
    for x, lengths in loader:
        x, lengths = x.cuda(), lengths.cuda()
        out = decoder(model(x), lengths)
        out.sum().backward()
        opt.step()
"""


def test_a_loop_that_fills_rows_of_a_tensor_keeps_its_callers_per_batch_reads(
    tmp_path: Path,
) -> None:
    # the row loop stores into `rnn_out` in place and carries nothing from step to step: it is
    # no batch loop of its own, and the lengths its per-batch caller moved are read per row
    found = _project(tmp_path, {"train.py": FILLED}, "TPL201")
    assert found == [("train.py", 8), ("train.py", 9), ("train.py", 9)]  # a bound and a size


VARIABLE = """\
import torch
from torch import nn
from torch.autograd import Variable

class Encoding(nn.Module):
    def __init__(self, b, c):
        super().__init__()
        self.G = Variable(torch.Tensor(b, c, c), requires_grad=True)
        self.w = nn.Parameter(torch.Tensor(b, c))

    def forward(self, x):
        return x @ self.G
"""


def test_a_tensor_wrapped_in_a_legacy_variable_is_a_plain_tensor_attribute() -> None:
    # (TPL501) `Variable(...)` hands back the tensor it wraps
    assert _lines(VARIABLE, "TPL501") == [8]


SCATTER = """\
import torch
from torch.nn.parallel import DataParallel

class MultiEval(DataParallel):
    def parallel_forward(self, inputs):
        inputs = [(x.unsqueeze(0).cuda(d),) for x, d in zip(inputs, self.device_ids)]
        first = inputs[0][0].cuda(self.device_ids[0])
        anywhere = inputs[0][0].cuda()
        return inputs, first, anywhere
"""


def test_a_data_parallel_wrapper_places_on_the_devices_it_was_given() -> None:
    # (TPL102) scattering over `self.device_ids` follows what the caller chose
    assert _lines(SCATTER, "TPL102") == [8]


ACCUMULATES = """\
import torch

def train_disc(disc, opt, batches, device):
    opt.zero_grad()
    for batch in batches:
        logits = disc(batch["obs"].to(device))
        loss = logits.mean()
        loss.backward()
    opt.step()
    print(loss.item())

def epoch(model, opt, batches, device):
    for batch in batches:
        loss = model(batch.to(device)).mean()
        loss.backward()
        opt.step()
    print(loss.item())
"""


def test_a_loop_of_backward_passes_before_one_step_is_the_step_s_micro_batches() -> None:
    # the function is one training step; an epoch that steps in its loop reads once after it
    assert _lines(ACCUMULATES, "TPL201") == [10]


OPTIMIZER_HELPER = """\
import torch

def get_optimizer(net, lr):
    decay = [p for n, p in net.named_parameters() if "bn" not in n]
    return torch.optim.SGD(decay, lr=lr)

def load_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-4)
"""

CALLER = """\
from train_utils import get_optimizer, load_optimizer

def main(model, wrapper, gpu):
    optimizer = get_optimizer(model.model, 0.03)
    model.model = model.model.cuda(gpu)
    wrapper = wrapper.to("cuda")
    second = load_optimizer(wrapper)
    wrapper = wrapper.to("cuda")
    return optimizer, second
"""


def test_a_caller_in_another_module_moves_the_model_after_the_helper_built_its_optimizer(
    tmp_path: Path,
) -> None:
    # (TPL801) a caller that moved the model before handing it over moves nothing later
    files = {"setup.cfg": "", "train_utils.py": OPTIMIZER_HELPER, "fixmatch.py": CALLER}
    assert _project(tmp_path, files, "TPL801") == [("train_utils.py", 5)]


OLD_ACCURACY = """\
import torch
from torch.autograd import Variable

def train(loader, model, criterion, optimizer, top1, losses):
    for input, target in loader:
        target = target.cuda(non_blocking=True)
        input_var, target_var = Variable(input.cuda()), Variable(target)
        output = model(input_var)
        loss = criterion(output, target_var)
        prec1, prec5 = accuracy(output.data, target, topk=(1, 5))
        losses.update(loss.data[0], input.size(0))
        top1.update(prec1[0], input.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

def validate(loader, model, criterion, top1, losses):
    for input, target in loader:
        output = model(input.cuda())
        loss = criterion(output, target.cuda())
        acc1, acc5 = accuracy(output, target.cuda(), topk=(1, 5))
        losses.update(loss.item(), input.size(0))
        top1.update(acc1[0], input.size(0))
"""


def test_an_accuracy_indexed_in_code_written_before_pytorch_0_4_is_read() -> None:
    # where the function reads its loss with `.data[0]`; in later code `acc1[0]` is a 0-dim
    # tensor, left on the device
    assert _lines(OLD_ACCURACY, "TPL201") == [11, 12, 22]
