"""Round 81 (TPL202): a loop that times each step after a warm-up, under a flag it never
rebinds (``if count_time and i >= 5:``), synchronizes on purpose."""

from __future__ import annotations

from .helpers import lines as _lines

TIMED = """\
import time
import torch


def evaluate(model, loader, count_time=False):
    total = 0.0
    for i, sample in enumerate(loader):
        if count_time and i >= 5:
            torch.cuda.synchronize()
            start = time.perf_counter()
        pred = model(sample.cuda())
        if count_time and i >= 5:
            torch.cuda.synchronize()
            total += time.perf_counter() - start
    return pred, total
"""


def test_a_flag_guarded_clock_after_a_warm_up_times_each_step() -> None:
    assert _lines(TIMED, "TPL202") == []


def test_the_same_syncs_without_a_clock_are_reported() -> None:
    untimed = TIMED.replace("            start = time.perf_counter()\n", "").replace(
        "            total += time.perf_counter() - start\n", ""
    )
    assert _lines(untimed, "TPL202") == [9, 12]
