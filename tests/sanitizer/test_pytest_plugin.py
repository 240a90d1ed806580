"""The pytest plugin, run on a throw-away test suite with pytester."""

from __future__ import annotations

import pytest

SUITE = """
import pytest
import torch

META = torch.device("meta")


@pytest.mark.max_transfers(h2d=1, d2h=0)
def test_within_limits():
    torch.ones(2).to(META)


@pytest.mark.max_transfers(h2d=1)
def test_too_many_copies():
    for _ in range(2):
        torch.ones(2).to(META)


@pytest.mark.max_syncs(0)
def test_a_sync():
    try:
        torch.ones(2, device=META).sum().item()
    except RuntimeError:
        pass  # meta cannot answer; the read was still attempted


@pytest.mark.max_syncs(0)
def test_blocking_copy_is_a_sync():
    torch.ones(2).to(META)


@pytest.mark.max_syncs(0)
def test_non_blocking_copy_is_not_a_sync():
    torch.ones(2).to(META, non_blocking=True)


@pytest.mark.max_transfers(h2d=1)
@pytest.mark.max_syncs(1)
def test_one_blocking_copy_within_both_limits():
    torch.ones(2).to(META)


@pytest.mark.max_syncs(1)
def test_cpu_item_is_no_sync():
    assert torch.ones(2).sum().item() == 2.0


def test_fixture_is_the_report(torchplace_guard):
    torch.ones(3).to(META)
    assert torchplace_guard.h2d == 1
    assert torchplace_guard.h2d_bytes == 12


def test_unguarded_test_is_left_alone():
    torch.ones(2).to(META)
"""


def test_markers_and_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--strict-markers", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=6, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_too_many_copies*",
            "*device crossing limits exceeded: h2d: 2 > max 1*",
            "*test_suite.py*test_too_many_copies*h2d*2*",
        ]
    )
    result.stdout.fnmatch_lines(["*test_a_sync*", "*syncs: 1 > max 0*"])
    # a blocking host-to-device copy counts against max_syncs, with its line in the table
    result.stdout.fnmatch_lines(
        [
            "*test_blocking_copy_is_a_sync*",
            "*syncs: 1 > max 0*",
            "*test_suite.py*test_blocking_copy_is_a_sync* sync *1*",
        ]
    )
    summary = {line for line in result.stdout.lines if line.startswith(("PASSED", "FAILED"))}
    assert "PASSED test_suite.py::test_non_blocking_copy_is_not_a_sync" in summary
    assert "PASSED test_suite.py::test_one_blocking_copy_within_both_limits" in summary
    assert any(
        line.startswith("FAILED test_suite.py::test_blocking_copy_is_a_sync") for line in summary
    )


def test_bad_marker_arguments_are_usage_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.max_transfers(h2x=1)
        def test_typo():
            pass

        @pytest.mark.max_syncs(-1)
        def test_negative():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*unknown max_transfers limit 'h2x'*"])
    assert result.ret != 0


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.max_transfers(*", "@pytest.mark.max_syncs(*"])
