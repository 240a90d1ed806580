"""Site attribution: every event points at the user's line, not torch's or the standard library's."""

from __future__ import annotations

import pytest
import torch

import torchplace
from torchplace.models import build_model
from torchplace.sanitizer.sites import user_site

from .fakes import META, MetaReadback, line_of

HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


def test_copies_inside_module_to_are_attributed_to_the_calling_line() -> None:
    model = build_model("seed-mlp")
    with torchplace.guard() as report:
        model.to(META)  # module-to
    assert report.h2d == 4  # two weights, two biases
    assert report.h2d_bytes == sum(p.numel() * 4 for p in build_model("seed-mlp").parameters())
    assert len(report.syncs) == 4  # each blocking copy waits: one sync per copy
    assert {e.site.lineno for e in report.events} == {line("module-to")}


def test_print_line_is_the_users(capsys: pytest.CaptureFixture[str]) -> None:
    t = torch.ones(4, device=META)
    with torchplace.guard() as report:
        print("loss", t)  # print-line
    (sync,) = report.syncs
    assert (sync.site.filename, sync.site.lineno) == (HERE, line("print-line"))
    capsys.readouterr()


def test_user_site_skips_torch_frames() -> None:
    site = user_site()
    assert site.filename == HERE
    assert site.function == "test_user_site_skips_torch_frames"


def test_standard_library_frames_are_not_the_users_line() -> None:
    import statistics

    values = [torch.ones((), device=META), torch.ones((), device=META)]
    with MetaReadback(), torchplace.guard() as report:
        # float() of each value happens inside statistics.py
        statistics.fmean(values)  # stdlib-line
    assert len(report.syncs) == 2
    assert {e.site.lineno for e in report.events} == {line("stdlib-line")}
