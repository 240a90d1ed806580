"""Round 46: the ``else`` of a branch taken on few steps runs on the others (DLRM's evaluation
loop copying the scores under ``if args.mlperf_logging:`` and scoring each batch on the host in
the ``else``)."""

from __future__ import annotations

from .helpers import lines

# ---- TPL201: a read in the `else` of a test naming logging, or of a periodic test

INFERENCE = """\
import numpy as np
import torch


def inference(args, model, test_ld, device):
    test_accu = 0
    scores = []
    for i, (x, t) in enumerate(test_ld):
        z = model(x.to(device))
        if {test}:
            s = z.detach().cpu().numpy()
            scores.append(s)
        else:
            s = z.detach().cpu().numpy()
            test_accu += np.sum(np.round(s, 0) == t.numpy())
    return test_accu
"""


def test_read_in_the_else_of_a_logging_test_is_found() -> None:
    # the `else` runs whenever the logging mode is off: on every step of such a run
    source = INFERENCE.format(test="args.mlperf_logging")
    assert lines(source, "TPL201") == [14]


def test_read_in_the_else_of_a_periodic_test_is_found() -> None:
    # `i % 100 == 0` holds on one step in a hundred; its `else` on the 99 others
    source = INFERENCE.format(test="i % 100 == 0")
    assert lines(source, "TPL201") == [14]


def test_read_in_the_else_of_a_negated_logging_test_is_clean() -> None:
    # `if not should_log:` ... `else:` is the logging branch, taken on few steps
    source = INFERENCE.format(test="not args.should_log").replace(
        "            s = z.detach().cpu().numpy()\n            scores.append(s)\n",
        "            scores.append(None)\n",
    )
    assert lines(source, "TPL201") == []
