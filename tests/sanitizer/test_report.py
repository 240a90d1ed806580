"""GuardReport: questions, grouping, table and JSON (no device needed)."""

from __future__ import annotations

import json

import pytest

from torchplace.errors import ConfigError
from torchplace.sanitizer import Event, GuardReport, Operand, Site

A = Site("/proj/train.py", 10, "step")
B = Site("/proj/train.py", 20, "step")
C = Site("/proj/eval.py", 5, "main")


def _report() -> GuardReport:
    report = GuardReport()
    for _ in range(3):
        report.add(Event("h2d", A, "aten._to_copy", 1024, "cpu", "cuda:0"))
        report.add(Event("d2h", B, "aten._to_copy", 8, "cuda:0", "cpu"))
        report.add(Event("sync", B, "aten._to_copy", detail="blocking device-to-host copy"))
    report.add(Event("d2d", C, "aten.copy_", 4096, "cuda:0", "cuda:1"))
    report.add(Event("sync", C, "Tensor.item"))
    report.add(Event("pageable_non_blocking", A, "aten._to_copy"))
    report.add(
        Event(
            "mixed_device",
            C,
            "F.linear",
            operands=(
                Operand("input", (2, 3), "float32", "cpu"),
                Operand("weight", (4, 3), "float32", "cuda:0"),
            ),
        )
    )
    return report


def test_counts_and_bytes() -> None:
    report = _report()
    assert (report.h2d, report.d2h, report.d2d) == (3, 3, 1)
    assert (report.h2d_bytes, report.d2h_bytes, report.d2d_bytes) == (3072, 24, 4096)
    assert len(report.transfers) == 7
    assert len(report.syncs) == 4
    assert len(report.pageable_non_blocking) == 1
    assert len(report.mixed_device_ops) == 1
    assert len(report) == len(report.events) == 13
    assert report.count("transfer") == 7
    assert report.nbytes("transfer") == 3072 + 24 + 4096


def test_filter_by_kind_site_and_op() -> None:
    report = _report()
    assert len(report.filter("sync", site="train.py")) == 3
    assert len(report.filter(site="train.py:20")) == 6
    assert len(report.filter(site="proj/eval.py:5:main")) == 3
    assert report.filter(site="rain.py") == []  # a path suffix, not a substring
    assert [e.op for e in report.filter("sync", op="item")] == ["Tensor.item"]
    with pytest.raises(ConfigError, match="unknown event kind 'copies'"):
        report.filter("copies")


def test_groups_by_line_and_kind_busiest_first() -> None:
    rows = _report().by_site()
    assert [(r.site.lineno, r.kind, r.count) for r in rows[:3]] == [
        (10, "h2d", 3),
        (20, "d2h", 3),
        (20, "sync", 3),
    ]
    assert rows[0].nbytes == 3072
    assert rows[0].directions == ("cpu->cuda:0",)
    assert len(rows) == 7
    assert [r.kind for r in _report().top(2)] == ["h2d", "d2h"]


def test_json_round_trips_totals_sites_and_events() -> None:
    data = json.loads(_report().to_json(top=2))
    assert data["totals"]["h2d"] == {"count": 3, "bytes": 3072}
    assert data["totals"]["sync"]["count"] == 4
    assert len(data["sites"]) == 2
    assert data["sites"][0]["file"] == "/proj/train.py"
    assert data["sites"][0]["line"] == 10
    assert len(data["events"]) == 13
    mixed = data["events"][-1]
    assert mixed["operands"][1] == {
        "name": "weight",
        "shape": [4, 3],
        "dtype": "float32",
        "device": "cuda:0",
    }


def test_table_lists_each_line_with_counts_and_bytes() -> None:
    text = _report().format(top=3)
    assert "train.py" in text
    assert "3 KiB" in text
    assert "aten._to_copy cpu->cuda:0" in text
    assert "eval.py:5" not in text  # cut by top
    assert "13 events" in text
    assert "eval.py" in str(_report())


def test_event_description_names_operands() -> None:
    (event,) = _report().mixed_device_ops
    text = event.describe()
    assert "F.linear" in text
    assert "input: shape=(2, 3) dtype=float32 device=cpu" in text
    assert "weight: shape=(4, 3) dtype=float32 device=cuda:0" in text


def test_empty_report_is_truthy_and_renders() -> None:
    report = GuardReport()
    assert report
    assert report.events == []
    assert "0 events: no device crossing or host sync was recorded" in report.format()
    assert "h2d 0" not in report.format()  # no kind is listed with a zero count
    with pytest.raises(ConfigError, match="top"):
        report.top(-1)


def test_events_past_the_cap_are_counted_not_kept() -> None:
    report = GuardReport(max_events=2)
    for _ in range(5):
        report.add(Event("h2d", A, "aten._to_copy", 10, "cpu", "cuda:0"))
    assert len(report.events) == 2
    assert report.dropped == 3
    assert (len(report), report.h2d, report.h2d_bytes) == (5, 5, 50)
    assert report.by_site()[0].count == 5
    assert report.to_dict()["events_dropped"] == 3
    with pytest.raises(ConfigError, match="max_events"):
        GuardReport(max_events=-1)
    with pytest.raises(ConfigError, match="unknown event kind"):
        report.add(Event("teleport", A, "x"))
