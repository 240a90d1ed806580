"""Round 86 (TPL201): a key of ``sort``, ``sorted``, ``min`` or ``max`` runs once per item
right where it is given, so a read in it, ``ids.sort(key=lambda x: out[i][x].item())``, is a
read per item of each step; a copy handed to a speech-quality score (``pesq``), which takes
NumPy audio only, is the metric's input, as one for scikit-learn's is."""

from __future__ import annotations

from .helpers import lines as _lines

BEAM = """\
import torch


def beam(model, x, ids, steps):
    model = model.cuda()
    x = x.cuda()
    for step in range(steps):
        out = model(x)
        ids.sort(key=lambda i: out[0][i].item(), reverse=True)
        best = max(ids, key=lambda i: float(out[0][i]))
        order = sorted(range(3), key=lambda k: -k)
    return ids, best, order
"""


def test_a_read_in_a_sort_key_runs_per_item_there() -> None:
    assert _lines(BEAM, "TPL201") == [9, 10]


def test_a_key_kept_to_run_later_is_left_alone() -> None:
    kept = BEAM.replace("ids.sort(key=lambda", "scorer = dict(key=lambda")
    assert _lines(kept, "TPL201") == [10]


VALIDATE = """\
import torch
from pesq import pesq


def validate(generator, loader, device):
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            y_hat = generator(x.to(device))
            ref = y[0].cpu().numpy()
            deg = y_hat[0].cpu().numpy()
            total += pesq(16000, ref, deg, "wb")
    return total
"""


def test_audio_copied_for_pesq_is_the_metrics_input() -> None:
    assert _lines(VALIDATE, "TPL201") == []


def test_audio_copied_for_a_project_function_is_still_reported() -> None:
    own = VALIDATE.replace("from pesq import pesq", "from .metrics import score")
    assert _lines(own.replace("pesq(16000", "score(16000"), "TPL201") == [11]
