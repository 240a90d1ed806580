"""`torchplace serve` flags: each documented, file + flags merged, errors are usage errors."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchplace.cli import main
from torchplace.errors import ConfigError
from torchplace.models import TensorSpec
from torchplace.serve import cli
from torchplace.serve.config import ServeConfig


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(list(argv))


def test_no_arguments_gives_the_defaults() -> None:
    assert cli.config_from_args(_parse()) == ServeConfig()


def test_every_field_has_a_documented_flag() -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    helps = {a.dest: a.help for a in parser._actions}
    for name in ServeConfig.field_names():
        if name == "models":  # the models after the first --model, when it is repeated
            assert "repeat it" in str(helps["model"])
            continue
        assert helps.get(name), f"no documented flag for {name}"
    assert helps["config"]


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "serve.json"
    path.write_text(json.dumps({"model": "wide-mlp", "port": 9000, "max_batch_size": 4}))
    config = cli.config_from_args(
        _parse(
            "--config",
            str(path),
            "--port",
            "0",
            "--input",
            "input:FP32:-1,512",
            "--devices",
            "cpu,cpu",
            "--no-metrics",
            "--allow-nan",
            "--request-timeout",
            "2",
        )
    )
    assert config.model == "wide-mlp"  # from the file
    assert config.max_batch_size == 4
    assert config.port == 0  # the flag wins
    assert config.inputs == (TensorSpec("input", "FP32", (-1, 512)),)
    assert config.devices == ("cpu", "cpu")
    assert config.metrics is False
    assert config.allow_nan is True
    assert config.request_timeout_s == 2.0


def test_bad_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="max_batch_size=0"):
        cli.config_from_args(_parse("--max-batch-size", "0"))


def test_usage_error_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--max-batch-size", "0"]) == 2
    assert "max_batch_size=0" in capsys.readouterr().err


def test_a_ray_flag_without_the_ray_engine_is_refused_not_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--replicas 4`` alone served with one replica: it is Ray's flag, read only with
    ``--engine ray``."""
    assert main(["serve", "--port", "0", "--replicas", "4"]) == 2
    err = capsys.readouterr().err
    assert "--replicas only applies with --engine ray" in err
    assert "--replicas-per-device" in err
    assert main(["serve", "--port", "0", "--engine", "local", "--ray-proxy", "HeadOnly"]) == 2
    assert "--ray-proxy" in capsys.readouterr().err


def test_unwritable_trace_file_is_refused_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nodir" / "trace.json"
    assert main(["serve", "--port", "0", "--trace-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing.parent) in err
    assert "does not exist" in err
    assert main(["serve", "--port", "0", "--trace-file", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_missing_serve_extra_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name in ("orjson", "httptools") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["serve", "--port", "0"]) == 2  # before any model is loaded or port bound
    err = capsys.readouterr().err
    assert "httptools, orjson not installed" in err
    assert "pip install 'torchplace[serve]'" in err


def test_help_lists_the_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "torchplace.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for flag in (
        "--config",
        "--model",
        "--weights",
        "--exported",
        "--input",
        "--devices",
        "--max-batch-size",
        "--max-delay-ms",
        "--host",
        "--port",
        "--max-body-bytes",
        "--auth-token-file",
        "--drain-timeout",
        "--trace-file",
        "--fallback",
    ):
        assert flag in out
    assert "127.0.0.1" in out


def test_repeated_model_flags_and_the_repository_flags(tmp_path: Path) -> None:
    config = cli.config_from_args(
        _parse(
            "--model", "seed-mlp", "--model", "wide-mlp", "--model-repository", str(tmp_path),
            "--model-control-mode", "poll", "--repository-poll-secs", "2",
            "--memory-budget", "2GiB", "--load-model", "a", "--load-model", "b",
        )
    )  # fmt: skip
    assert config.model == "seed-mlp"
    assert config.models == ("wide-mlp",)
    assert config.model_repository == tmp_path
    assert config.model_control_mode == "poll"
    assert config.repository_poll_secs == 2.0
    assert config.memory_budget == 2 * 2**30
    assert config.load_models == ("a", "b")


def test_repository_flags_are_checked() -> None:
    with pytest.raises(ConfigError, match="explicit and poll need a --model-repository"):
        cli.config_from_args(_parse("--model-control-mode", "explicit"))
    with pytest.raises(ConfigError, match="memory_budget: cannot read the size 'lots'"):
        cli.config_from_args(_parse("--memory-budget", "lots"))
    with pytest.raises(ConfigError, match="--name, --weights, --exported"):
        cli.config_from_args(_parse("--model", "seed-mlp", "--model", "wide-mlp", "--name", "x"))


def test_the_gil_switch_interval_flag_and_its_check() -> None:
    assert ServeConfig().gil_switch_interval_ms == 0.2
    config = cli.config_from_args(_parse("--gil-switch-interval-ms", "1.5"))
    assert config.gil_switch_interval_ms == 1.5
    with pytest.raises(ConfigError, match="gil_switch_interval_ms=0"):
        cli.config_from_args(_parse("--gil-switch-interval-ms", "0"))


def test_the_inline_batch_flags_and_their_checks() -> None:
    assert ServeConfig().inline_batch_ms == 1.0
    assert cli.config_from_args(_parse("--inline-batch-ms", "0")).inline_batch_ms == 0.0
    with pytest.raises(ConfigError, match="inline_batch_ms=-1"):
        cli.config_from_args(_parse("--inline-batch-ms", "-1"))
    assert ServeConfig().inline_full_batch_ms == 50.0
    config = cli.config_from_args(_parse("--inline-full-batch-ms", "0"))
    assert config.inline_full_batch_ms == 0.0
    with pytest.raises(ConfigError, match="inline_full_batch_ms=-2"):
        cli.config_from_args(_parse("--inline-full-batch-ms", "-2"))


def test_serving_sets_the_gil_switch_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command owns its process: it shortens how long the loop may keep the GIL."""
    import sys

    from torchplace.serve import running

    seen: list[float] = []

    async def served(config: ServeConfig, **kwargs: Any) -> int:
        seen.append(sys.getswitchinterval())
        return 0

    monkeypatch.setattr(running, "serve", served)
    before = sys.getswitchinterval()
    try:
        assert main(["serve", "--port", "0", "--gil-switch-interval-ms", "0.5"]) == 0
    finally:
        sys.setswitchinterval(before)
    assert seen == [pytest.approx(0.0005)]


def test_unbatched_is_a_flag_and_off_by_default() -> None:
    assert cli.config_from_args(_parse("--unbatched")).unbatched
    assert not cli.config_from_args(_parse()).unbatched
