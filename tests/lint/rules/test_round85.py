"""Round 85 (TPL201): a store into a slice, ``row[:n] = 0``, changes the tensor, not the
names of its index: ``n``, a row of a device tensor a loop walks, is still read back by each
slice it bounds."""

from __future__ import annotations

from .helpers import lines as _lines

MASKS = """\
import torch


def pad_rows(x):
    lengths = torch.arange(4, device="cuda")
    for row, n in zip(x, lengths):
        row[:n] = 0
    return x


def clear_tail(x, lengths):
    lengths = lengths.cuda()
    for n in lengths:
        x[:n] = 0
    return x
"""


def test_a_slice_store_bounded_by_a_device_row() -> None:
    assert _lines(MASKS, "TPL201") == [7, 14]


def test_a_bound_that_is_a_python_number_is_left_alone() -> None:
    host = MASKS.replace('torch.arange(4, device="cuda")', "list(range(4))")
    assert (
        _lines(host.replace("lengths = lengths.cuda()", "lengths = lengths.tolist()"), "TPL201")
        == []
    )
