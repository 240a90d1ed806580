"""The founding article's section 2.3, under the guard.

The article's two loops, verbatim apart from the device: ``meta`` stands in for the
accelerator and :class:`~tests.sanitizer.fakes.MetaReadback` answers the host read-backs with
zeros, so the program runs to the end on a CPU-only machine while the guard sees exactly the ops
it would see on a GPU.
"""

from __future__ import annotations

import torch

import torchplace
from torchplace.models import build_model

from .fakes import MetaReadback, line_of

HERE = __file__
STEPS = 5


def _setup() -> tuple[torch.nn.Module, torch.device, list[torch.Tensor]]:
    device = torch.device("meta")
    model = build_model("seed-mlp").to(device)
    batches = [torch.randn(4, 8) for _ in range(STEPS)]
    return model, device, batches


def test_not_recommended_loop_reports_one_d2h_per_step_at_its_line() -> None:
    model, device, batches = _setup()
    with MetaReadback(), torchplace.guard() as report:
        # 不推荐：每一步都发生 D2H/H2D
        for batch in batches:
            scores = model(batch.to(device))  # article-h2d
            scores = scores.cpu()  # article-d2h
            decisions = scores.argmax(dim=-1)
    assert decisions.shape == (4,)
    d2h = report.filter("d2h")
    assert len(d2h) == STEPS
    assert {e.site.lineno for e in d2h} == {line_of(HERE, "article-d2h")}
    assert report.d2h_bytes == STEPS * 4 * 2 * 4  # 4 rows x 2 scores x float32, each step
    h2d = report.filter("h2d")
    assert len(h2d) == STEPS
    assert {e.site.lineno for e in h2d} == {line_of(HERE, "article-h2d")}
    # both copies are blocking: the host waits for the device twice per step
    syncs = report.syncs
    assert len(syncs) == 2 * STEPS
    assert [(e.op, e.detail) for e in syncs[:2]] == [
        ("aten._to_copy", "blocking host-to-device copy"),
        ("aten._to_copy", "blocking device-to-host copy"),
    ]
    rows = report.by_site()
    assert {(r.site.lineno, r.kind, r.count) for r in rows} == {
        (line_of(HERE, "article-d2h"), "d2h", STEPS),
        (line_of(HERE, "article-d2h"), "sync", STEPS),
        (line_of(HERE, "article-h2d"), "h2d", STEPS),
        (line_of(HERE, "article-h2d"), "sync", STEPS),
    }


def test_recommended_version_reports_one_d2h_at_the_end() -> None:
    model, device, batches = _setup()
    batch = batches[0]
    with MetaReadback(), torchplace.guard() as report:
        with torch.inference_mode():
            scores = model(batch.to(device))  # article-input
            decisions = scores.argmax(dim=-1)

        # 只在输出边界回 CPU
        answer = decisions.cpu().tolist()  # article-answer
    assert answer == [0, 0, 0, 0]
    (d2h,) = report.filter("d2h")
    assert d2h.site.lineno == line_of(HERE, "article-answer")
    assert d2h.nbytes == 4 * 8  # four int64 decisions
    assert report.h2d == 1
    # the two blocking copies; tolist() then reads host memory
    assert [(e.site.lineno, e.detail) for e in report.syncs] == [
        (line_of(HERE, "article-input"), "blocking host-to-device copy"),
        (line_of(HERE, "article-answer"), "blocking device-to-host copy"),
    ]


def test_recommended_loop_over_many_batches_still_reads_back_once() -> None:
    model, device, batches = _setup()
    with MetaReadback(), torchplace.guard() as report:
        with torch.inference_mode():
            decisions = [model(b.to(device)).argmax(dim=-1) for b in batches]  # article-each
        answer = torch.cat(decisions).cpu().tolist()  # article-once
    assert len(answer) == STEPS * 4
    assert report.h2d == STEPS
    (d2h,) = report.filter("d2h")
    assert d2h.site.lineno == line_of(HERE, "article-once")
    # one wait per blocking input copy (pinned memory and non_blocking=True would avoid them)
    # and one for the answer
    assert [e.site.lineno for e in report.syncs] == [line_of(HERE, "article-each")] * STEPS + [
        line_of(HERE, "article-once")
    ]
