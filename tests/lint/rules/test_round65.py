"""Round 65: counts of a data-dependent result and a tensor `clamp` bound beside a number, both
made Python numbers on the host (TPL201)."""

from __future__ import annotations

from .helpers import lines as _lines

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
