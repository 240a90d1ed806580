"""benchmarks/serve_profile.py's options: ``--quick`` times fewer runs per stage."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.scripts import benchmark_fixture, usage_error

bench = benchmark_fixture("serve_profile")


def test_quick_times_fewer_runs_per_stage(bench: ModuleType) -> None:
    assert bench.parse_args([]).repeat == bench.REPEAT
    assert bench.parse_args(["--quick"]).repeat == bench.QUICK_REPEAT < bench.REPEAT
    assert bench.parse_args(["--quick", "--repeat", "50"]).repeat == 50


def test_a_repeat_below_one_is_a_usage_error(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--repeat 0" in usage_error(bench.parse_args, ["--repeat", "0"], capsys)


def test_the_in_memory_closed_loop_answers_every_client(bench: ModuleType) -> None:
    from torchplace.serve.config import ServeConfig

    config = ServeConfig(model="seed-mlp", device="cpu", port=0, drain_grace_s=0.0)
    body = b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,8],"data":[0,1,2,3,4,5,6,7]}]}'
    cost = bench._loop_cpu(config, body, "seed-mlp", repeat=40, clients=4)
    assert 0.0 < cost < 100_000.0  # microseconds of CPU a request: every round was answered
    wrong = body.replace(b'"input"', b'"x"')
    with pytest.raises(RuntimeError, match=r"requests were not answered 200: b'HTTP/1.1 400"):
        bench._loop_cpu(config, wrong, "seed-mlp", repeat=40, clients=4)
