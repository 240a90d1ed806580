"""ServeConfig: defaults, validation naming the bad field, files, spec syntax."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchplace.errors import ConfigError
from torchplace.models import TensorSpec
from torchplace.serve.config import ServeConfig, load_config_file, parse_tensor_spec


def test_defaults_serve_seed_mlp_on_loopback_8000() -> None:
    config = ServeConfig()
    assert (config.model, config.host, config.port) == ("seed-mlp", "127.0.0.1", 8000)
    assert config.max_batch_size == 32
    assert config.max_body_bytes == 64 * 1024 * 1024
    assert config.inputs is None
    assert config.devices is None


def test_is_frozen_and_keyword_only() -> None:
    config = ServeConfig()
    with pytest.raises(AttributeError):
        config.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        ServeConfig("seed-mlp")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", ""),
        ("model_version", "a/b"),
        ("device", " "),
        ("port", 70000),
        ("port", -1),
        ("port", True),
        ("max_batch_size", 0),
        ("max_batch_size", 1 << 21),
        ("replicas_per_device", 5000),
        ("max_delay_ms", 1e308),
        ("max_queue", 0),
        ("replicas_per_device", 0),
        ("failure_threshold", 0),
        ("max_body_bytes", 10),
        ("max_delay_ms", -1.0),
        ("max_delay_ms", float("nan")),
        ("request_timeout_s", 0.0),
        ("drain_timeout_s", float("inf")),
        ("fallback", "gpu"),
        ("log_level", "loud"),
        ("allow_nan", "yes"),
        ("devices", ()),
        ("devices", ("cuda:0", "")),
        ("device", "meta"),
        ("devices", ("cpu", "meta")),
        ("weights", "model.pt"),
        ("max_request_rows", 0),
        ("priority_levels", 0),
        ("default_priority", 2),
        ("priority_queue_limits", (8, 8)),
        ("default_timeout_ms", -1.0),
        ("max_queue_wait_ms", float("inf")),
        ("drain_grace_s", -0.5),
        ("default_timeout_ms", 1e20),  # its Triton config field (microseconds) cannot hold it
        ("drain_grace_s", 1e20),
        ("request_timeout_s", 1e8),
        ("max_queue", 2**64),  # the start-up wrote it into a Triton document, and crashed
        ("priority_levels", 10**20),  # a queue limit per level: it crashed building them
        ("priority_queue_limits", (2**64,)),
    ],
)
def test_bad_values_name_the_field_and_value(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        ServeConfig(**{field: value})
    message = str(info.value)
    assert f"{field}=" in message
    assert repr(value) in message


def test_weights_and_exported_are_exclusive() -> None:
    with pytest.raises(ConfigError, match="either weights or exported"):
        ServeConfig(weights=Path("a.safetensors"), exported=Path("b.pt2"))


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("input:FP32:-1,8", TensorSpec("input", "FP32", (-1, 8))),
        ("x:fp16:-1", TensorSpec("x", "FP16", (-1,))),
        ("ids:INT64:-1,3,4", TensorSpec("ids", "INT64", (-1, 3, 4))),
    ],
)
def test_parse_tensor_spec(text: str, spec: TensorSpec) -> None:
    assert parse_tensor_spec(text) == spec


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("input", "NAME:DATATYPE:DIMS"),
        ("input:FP32", "NAME:DATATYPE:DIMS"),
        ("input:FP32:a,b", "comma-separated integers"),
        ("input:BYTES:-1", "not servable"),
        ("input:FP32:8", "must start with -1"),
        ("input:FP32:-1,-2", "below -1"),  # -1 after the batch is a variable dimension
        (":FP32:-1", "NAME:DATATYPE:DIMS"),
    ],
)
def test_bad_tensor_specs(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_tensor_spec(text)


def test_inputs_must_have_unique_names() -> None:
    with pytest.raises(ConfigError, match="unique"):
        ServeConfig(inputs=("a:FP32:-1", "a:FP32:-1,2"))  # type: ignore[arg-type]


def test_toml_file_with_serve_table(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(
        '[serve]\nmodel = "wide-mlp"\nmax-batch-size = 8\nmax_delay_ms = 3\n'
        'inputs = ["input:FP32:-1,512"]\n'
        'outputs = [{name = "output", datatype = "FP32", shape = [-1, 512]}]\n'
        'devices = "cpu,cpu"\nweights = "w.safetensors"\n'
    )
    config = ServeConfig.from_file(path)
    assert config.model == "wide-mlp"
    assert config.max_batch_size == 8
    assert config.max_delay_ms == 3.0
    assert isinstance(config.max_delay_ms, float)
    assert config.inputs == (TensorSpec("input", "FP32", (-1, 512)),)
    assert config.outputs == (TensorSpec("output", "FP32", (-1, 512)),)
    assert config.devices == ("cpu", "cpu")
    assert config.weights == Path("w.safetensors")


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "serve.json"
    path.write_text(json.dumps({"port": 9000, "allow_nan": True, "fallback": "cpu"}))
    config = ServeConfig.from_file(path)
    assert (config.port, config.allow_nan, config.fallback) == (9000, True, "cpu")


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("a.toml", "port = ", "not valid TOML"),
        ("a.json", "{", "not valid JSON"),
        ("a.yaml", "port: 1", "unknown format"),
        ("a.json", "[1]", "table of settings"),
        ("a.json", '{"prot": 1}', "unknown setting 'prot'"),
        ("a.json", '{"port": "80"}', "port='80'"),
        ("a.json", '{"inputs": 5}', "list of tensor declarations"),
        ("a.json", '{"inputs": [{"name": "x"}]}', "lacks 'datatype'"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, text: str, needle: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        ServeConfig.from_file(path)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config_file("/nonexistent/serve.toml")


def test_overrides_keep_the_rest() -> None:
    base = ServeConfig(model="wide-mlp", port=9000)
    config = base.with_overrides({"port": 0, "max-queue": 5})
    assert (config.model, config.port, config.max_queue) == ("wide-mlp", 0, 5)


def test_overload_and_priority_settings_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(
        "[serve]\nmax-request-rows = 1000\npriority-levels = 2\ndefault-priority = 1\n"
        'priority-queue-limits = "64,1024"\ndefault-timeout-ms = 250\n'
        "max-queue-wait-ms = 20\ndrain-grace-s = 0\n"
    )
    config = ServeConfig.from_file(path)
    assert config.max_request_rows == 1000
    assert (config.priority_levels, config.default_priority) == (2, 1)
    assert config.priority_queue_limits == (64, 1024)
    assert (config.default_timeout_ms, config.max_queue_wait_ms) == (250.0, 20.0)
    assert config.drain_grace_s == 0.0


def test_max_batch_size_0_names_where_no_batching_is_served() -> None:
    """Triton's max_batch_size 0 (a model without batching) given to the server is refused,
    naming how a repository model takes whole tensors (test_triton_unbatched.py serves one)."""
    with pytest.raises(ConfigError, match="Triton's 'no batching'") as info:
        ServeConfig(max_batch_size=0)
    assert "unbatched = true" in str(info.value)
    assert ServeConfig(unbatched=True).unbatched
    with pytest.raises(ConfigError, match="unbatched='yes' is invalid; give true or false"):
        ServeConfig(unbatched="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="give an integer >= 1"):
        ServeConfig(max_batch_size=-1)
