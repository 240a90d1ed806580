"""Recall round 35: a ``non_blocking=True`` copy whose source is a view or a dtype conversion of
a host tensor the function built, each next to the look-alike that must stay clean: a slice of
a tensor joined on the host (``x = buf[:-1]``, also when only one branch of an ``if`` joins),
and an ``int64`` pinned staging buffer converted to ``int32`` before the copy (the conversion
allocates new pageable memory; a plain slice of the pinned buffer stays pinned).
"""

from __future__ import annotations

from .helpers import lines as _lines

# ---- TPL701: a slice of a host join, copied asynchronously

SLICED_JOIN = """\
import torch


def next_batch(shard, spans, packed):
    if packed:
        chunk = torch.cat([shard[a:b] for a, b in spans])
        ids = chunk[:-1]
    else:
        chunk = shard[: spans[0][1]]
        ids = chunk[:-1].view(-1)
    ids = ids.to(dtype=torch.int32)
    return ids.to(device="cuda", non_blocking=True)
"""


def test_a_slice_of_a_host_join_is_pageable_even_in_one_branch() -> None:
    assert _lines(SLICED_JOIN, "TPL701") == [12]
    # straight code: the slice of the join itself, no conversion
    straight = (
        "import torch\n\n\n"
        "def window(rows, n):\n"
        "    table = torch.stack(rows)\n"
        "    head = table[:n, 1:]\n"
        "    return head.cuda(non_blocking=True)\n"
    )
    assert _lines(straight, "TPL701") == [7]


def test_slices_of_pinned_or_unknown_memory_are_left_alone() -> None:
    # the join is pinned before it is sliced
    pinned = SLICED_JOIN.replace(
        "torch.cat([shard[a:b] for a, b in spans])",
        "torch.cat([shard[a:b] for a, b in spans]).pin_memory()",
    )
    assert _lines(pinned, "TPL701") == []
    # a slice of a parameter: its memory is not known here
    unknown = (
        "import torch\n\n\n"
        "def window(table, n):\n"
        "    head = table[:n]\n"
        "    return head.cuda(non_blocking=True)\n"
    )
    assert _lines(unknown, "TPL701") == []


# ---- TPL701: a pinned staging buffer converted to another dtype on the host

PINNED_THEN_CONVERTED = """\
import torch


def batches(stream, n, device):
    staging = torch.empty(n + 1, dtype=torch.int64, pin_memory=True)
    while True:
        for i in range(n + 1):
            staging[i] = next(stream)
        inputs_host = staging[:-1].to(dtype=torch.int32)
        targets_host = staging[1:]
        inputs = inputs_host.to(device, non_blocking=True)
        targets = targets_host.to(device, non_blocking=True)
        yield inputs, targets
"""


def test_a_dtype_conversion_of_a_pinned_buffer_is_pageable() -> None:
    # the int32 copy of the pinned int64 buffer is new, unpinned memory; the plain slice is not
    assert _lines(PINNED_THEN_CONVERTED, "TPL701") == [11]
    # `.int()` converts the same way
    method = PINNED_THEN_CONVERTED.replace(".to(dtype=torch.int32)", ".int()")
    assert _lines(method, "TPL701") == [11]


def test_conversions_that_keep_the_dtype_or_run_on_the_device_are_left_alone() -> None:
    # the buffer already holds int32: `.to(dtype=torch.int32)` hands back the pinned buffer
    same = PINNED_THEN_CONVERTED.replace("dtype=torch.int64, pin", "dtype=torch.int32, pin")
    assert _lines(same, "TPL701") == []
    # the buffer's dtype is not written: the conversion may be a no-op
    unwritten = PINNED_THEN_CONVERTED.replace("dtype=torch.int64, pin", "pin")
    assert _lines(unwritten, "TPL701") == []
    # the conversion rides on the copy itself: the pinned slice is what is copied
    on_copy = PINNED_THEN_CONVERTED.replace(
        "inputs_host = staging[:-1].to(dtype=torch.int32)", "inputs_host = staging[:-1]"
    ).replace(
        "inputs_host.to(device, non_blocking=True)",
        "inputs_host.to(device=device, dtype=torch.int32, non_blocking=True)",
    )
    assert _lines(on_copy, "TPL701") == []
