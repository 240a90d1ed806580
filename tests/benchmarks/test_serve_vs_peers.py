"""benchmarks/serve_vs_peers.py without servers: which peers run and which are SKIP lines, and
how the targets are judged from given figures (no timing is measured here)."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest

from peers import venvs
from tests.scripts import benchmark_fixture, usage_error

bench = benchmark_fixture("serve_vs_peers")


def _args(bench: ModuleType, *argv: str) -> argparse.Namespace:
    args = bench.parse_args(list(argv))
    args.skipped = []
    args.client = "wrk"
    args.threads = 1
    args.device_resolved = "cpu"
    return args


def test_quick_never_builds_venvs_and_a_full_run_does(bench: ModuleType) -> None:
    assert bench.parse_args(["--quick"]).setup_peers is False
    assert bench.parse_args([]).setup_peers is True
    assert bench.parse_args(["--quick", "--setup-peers"]).setup_peers is True


def test_an_unknown_peer_is_a_usage_error(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "unknown Nope" in usage_error(bench.parse_args, ["--peers", "Triton,Nope"], capsys)


def test_peers_without_a_venv_are_skip_lines_with_the_reason(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "missing_modules", lambda peer: ["absent"])
    args = _args(bench, "--quick", "--venvs", str(tmp_path))
    peers = list(bench.PEERS)
    assert bench.peer_pythons(peers, args) == {}
    assert len(args.skipped) == len(peers)
    for peer, line in zip(peers, args.skipped, strict=True):
        assert line.startswith(f"{peer.name}: no venv at {tmp_path / peer.venv.name}")


def test_a_venv_that_cannot_be_built_is_a_skip_line(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(root: Path, spec: venvs.VenvSpec, constraints: Path, *, timeout: float) -> Path:
        raise venvs.SetupError(f"pip install failed: no {spec.name} for this platform")

    monkeypatch.setattr(bench.venvs, "build", fail)
    args = _args(bench, "--venvs", str(tmp_path), "--peers", "Triton")
    assert bench.peer_pythons([bench.PEERS[0]], args) == {}
    assert args.skipped == [
        "Triton: venv could not be built: pip install failed: no triton for this platform"
    ]


def _run(bench: ModuleType, server: str, model: str, rps: float, p99: float) -> object:
    return bench.Run(server, model, rps=rps, p50_ms=p99 / 2, p99_ms=p99, requests=100)


def test_targets_are_judged_against_triton_and_the_limits(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(bench, "--peers", "Triton", "--models", "seed-mlp")
    runs = [
        _run(bench, "torchplace", "seed-mlp", 24_000, 3.0),
        _run(bench, "Triton", "seed-mlp", 2_000, 9.0),
        _run(bench, bench.HTTP_LIMIT, "seed-mlp", 100_000, 1.0),
    ]
    assert bench.report(runs, {"seed-mlp": 50_000.0}, args) == 1  # 24% < 30% of the HTTP limit
    out = capsys.readouterr().out
    assert "PASS  seed-mlp: req/s 12.00x Triton (target >= 12x)" in out
    assert "PASS  seed-mlp: p99 3.00 ms below Triton's 9.00 ms" in out
    assert "FAIL  seed-mlp: 24% of the constant-reply HTTP limit (100,000/s)" in out


def test_a_peer_that_did_not_start_makes_its_targets_skip_lines(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(bench, "--peers", "Triton", "--models", "seed-mlp")
    failed = bench.Run("Triton", "seed-mlp", note="failed: exited with 1:\nno libpython")
    runs = [
        _run(bench, "torchplace", "seed-mlp", 24_000, 3.0),
        failed,
        _run(bench, bench.HTTP_LIMIT, "seed-mlp", 60_000, 1.0),
    ]
    assert bench.report(runs, {}, args) == 0
    out = capsys.readouterr().out
    assert (
        "SKIP  seed-mlp: Triton did not run, no target (>= 12x and p99 below) judged: "
        "failed: exited with 1: | no libpython"
    ) in out
    assert "Triton (target" not in out
    assert "PASS  seed-mlp: 40% of the constant-reply HTTP limit" in out


def test_a_server_listening_beyond_loopback_fails(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(bench, "--no-peers", "--models", "seed-mlp")
    run = _run(bench, "torchplace", "seed-mlp", 24_000, 3.0)
    run.extra["listens"] = ["127.0.0.1:8000", "0.0.0.0:9090"]
    assert bench.report([run], {}, args) == 1
    assert "FAIL  torchplace on seed-mlp listens on loopback only: ['0.0.0.0:9090']" in (
        capsys.readouterr().out
    )


def test_quick_prints_speed_targets_as_information(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(bench, "--quick", "--no-peers", "--models", "seed-mlp")
    runs = [
        _run(bench, "torchplace", "seed-mlp", 1_000, 3.0),
        _run(bench, bench.HTTP_LIMIT, "seed-mlp", 100_000, 1.0),
    ]
    assert bench.report(runs, {}, args) == 0
    out = capsys.readouterr().out
    assert "INFO  seed-mlp: 1% of the constant-reply HTTP limit" in out
    assert "PASS  seed-mlp: torchplace answered every request (errors 0)" in out


def _protocol_runs(bench: ModuleType, rest: float, grpc: float) -> list[object]:
    """torchplace over both protocols; in round 2 the machine was busier for gRPC alone."""
    runs = [_run(bench, "torchplace", "wide-mlp", 600, 50.0)]
    for protocol, rps in ((bench.REST_BINARY, rest), (bench.GRPC, grpc)):
        run = _run(bench, f"torchplace {protocol}", "wide-mlp", rps, 80.0)
        rounds = [rps, rps / 3 if protocol == bench.GRPC else rps, rps]
        run.extra = {
            "client": "perf_analyzer",
            "protocol": protocol,
            "rounds": [{"rps": r} for r in rounds],
        }
        runs.append(run)
    return runs


@pytest.mark.parametrize(("rest", "grpc", "verdict"), [(600, 650, "PASS"), (650, 600, "FAIL")])
def test_grpc_against_rest_binary_is_judged_on_wide_mlp(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], rest: float, grpc: float, verdict: str
) -> None:
    args = _args(bench, "--no-peers", "--models", "wide-mlp")
    assert bench.report(_protocol_runs(bench, rest, grpc), {}, args) == (verdict == "FAIL")
    out = capsys.readouterr().out
    ratio = grpc / rest  # the median of the per-round ratios: the busy round is left out
    assert (
        f"{verdict}  wide-mlp: gRPC req/s >= REST binary req/s on wide-mlp ({grpc:,.0f} vs "
        f"{rest:,.0f} req/s; paired ratio {ratio:.2f}x; perf_analyzer, 32 concurrent, 3 rounds)"
    ) in out
    assert f"torchplace gRPC/REST binary on wide-mlp: {ratio:.2f}x" in out


def test_grpc_rows_compare_with_torchplace_over_the_same_protocol(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(bench, "--no-peers", "--models", "wide-mlp", "--quick")
    runs = _protocol_runs(bench, 600, 500)
    triton = _run(bench, f"Triton {bench.GRPC}", "wide-mlp", 250, 80.0)
    triton.extra = {"client": "perf_analyzer", "compare_to": f"torchplace {bench.GRPC}"}
    assert bench.report([*runs, triton], {}, args) == 0  # --quick: information only
    out = capsys.readouterr().out
    assert "Triton gRPC              wide-mlp         250" in out
    assert "2.00x" in out
    assert "INFO  wide-mlp: gRPC req/s >= REST binary req/s on wide-mlp (500 vs 600" in out


def test_the_grpc_limit_is_a_perf_analyzer_row_and_torchplace_s_share_of_it_is_printed(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = bench.Workload("wide-mlp", [0.5, 0.25], {}, {})
    server = bench.grpc_limit_server(work, tmp_path)
    assert server.name == bench.GRPC_LIMIT
    assert server.load == bench.PERF_LOADS[bench.GRPC]
    assert server.target.startswith("127.0.0.1:")
    assert server.target not in server.url
    assert server.extra["compare_to"] == f"torchplace {bench.GRPC}"
    limit = _run(bench, bench.GRPC_LIMIT, "wide-mlp", 2_000, 20.0)
    limit.extra = dict(server.extra)
    args = _args(bench, "--no-peers", "--models", "wide-mlp", "--quick")
    bench.report([*_protocol_runs(bench, 600, 500), limit], {}, args)
    assert "torchplace at 25% of the gRPC limit on wide-mlp" in capsys.readouterr().out


def test_grpc_not_measured_is_a_skip_line_and_no_grpc_says_nothing(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(bench, "--no-peers", "--models", "wide-mlp")
    failed = bench.Run(f"torchplace {bench.GRPC}", "wide-mlp", note="failed: perf_analyzer: x")
    bench.report([_run(bench, "torchplace", "wide-mlp", 600, 50.0), failed], {}, args)
    assert (
        "SKIP  wide-mlp: gRPC req/s >= REST binary req/s on wide-mlp: not judged, torchplace "
        "was not measured over both: failed: perf_analyzer: x"
    ) in capsys.readouterr().out
    args = _args(bench, "--no-peers", "--models", "wide-mlp", "--no-grpc")
    bench.report([_run(bench, "torchplace", "wide-mlp", 600, 50.0)], {}, args)
    assert "gRPC" not in capsys.readouterr().out


def test_a_figure_beside_its_verdict_is_cut_not_rounded(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rounded, each of these would print the target's own number beside a verdict that says
    it was missed (2.50x, 80%) or met (5.0% against < 5%)."""
    args = _args(bench, "--peers", "Triton", "--models", "wide-mlp")
    runs = [
        _run(bench, "torchplace", "wide-mlp", 2_499.6, 3.0),
        _run(bench, "torchplace no-metrics", "wide-mlp", 2_630.0, 3.0),  # metrics cost 4.96%
        _run(bench, "Triton", "wide-mlp", 1_000.0, 9.0),
    ]
    assert bench.report(runs, {"wide-mlp": 2_499.6 / 0.7996}, args) == 1
    out = capsys.readouterr().out
    assert "FAIL  wide-mlp: req/s 2.49x Triton (target >= 2.5x)" in out
    assert "FAIL  wide-mlp: 79% of the in-process ceiling" in out
    assert "PASS  wide-mlp: metrics cost 4.9% of req/s (target < 5%)" in out
    assert "torchplace at 79% of it" in out  # the table's line agrees with the verdict


def test_cut_keeps_exact_decimals_and_non_finite_values(bench: ModuleType) -> None:
    assert bench.cut(0.29, 2) == 0.29  # 0.29 * 100 is 28.999999999999996 in binary
    assert bench.cut(0.8, 2) == 0.8
    assert bench.cut(1.0, 2) == 1.0
    assert bench.cut(0.0499, 3) == 0.049
    assert bench.cut(float("inf"), 2) == float("inf")
    assert bench.cut(float("nan"), 2) != bench.cut(float("nan"), 2)  # still NaN
