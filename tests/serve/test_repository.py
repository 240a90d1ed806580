"""Reading a model repository: layouts, version policies, inline configs and errors that name
the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from torchplace.errors import ConfigError
from torchplace.serve.repository import (
    VersionPolicy,
    inline_config,
    model_names,
    read_model,
    triton_settings,
)

from .repository_helpers import write_model, write_version

FULL = """source = "seed-mlp"
inputs = ["input:FP32:-1,8"]
devices = ["cpu"]
replicas = 2
dtype = "float32"
[batching]
max_batch_size = 4
max_delay_ms = 0.5
[version_policy]
latest = 2
"""


def test_a_full_config_and_the_latest_two_versions(tmp_path: Path) -> None:
    write_model(tmp_path, "m", config=FULL)
    for version in (2, 3):
        write_version(tmp_path, "m", version, scale=1.0)
    model = read_model(tmp_path, "m")
    assert model.versions == ("2", "3")
    settings = model.version_settings("3")
    assert settings["model"] == "seed-mlp"
    assert settings["name"] == "m"
    assert settings["model_version"] == "3"
    assert settings["replicas_per_device"] == 2
    assert settings["max_batch_size"] == 4
    assert settings["weights"] == str(tmp_path / "m" / "3" / "model.safetensors")


def test_a_model_s_queue_is_set_in_its_batching_table(tmp_path: Path) -> None:
    queue = "max_queue = 50\npriority_levels = 2\npriority_queue_limits = [5, 50]\n"
    write_model(tmp_path, "m", config=f'source = "seed-mlp"\n[batching]\n{queue}')
    settings = read_model(tmp_path, "m").version_settings("1")
    assert (settings["max_queue"], settings["priority_levels"]) == (50, 2)
    assert settings["priority_queue_limits"] == [5, 50]


def test_version_policies() -> None:
    assert VersionPolicy().select([3, 1, 2]) == [3]
    assert VersionPolicy("latest", 2).select([3, 1, 2]) == [2, 3]
    assert VersionPolicy("all").select([3, 1]) == [1, 3]
    assert VersionPolicy("specific", versions=(1, 7)).select([1, 2]) == [1]


@pytest.mark.parametrize(
    ("config", "field", "fix"),
    [
        ('source = "seed-mlp"\nreplica = 2\n', "field 'replica' is not a setting", "replicas"),
        ("replicas = 2\n", "field 'source' is missing", "embedded model"),
        ('source = "seed-mlp"\n[version_policy]\nlatest = 0\n', "version_policy.latest",
         "latest = N"),
        ('source = "seed-mlp"\n[version_policy]\nspecific = [9]\n', "version_policy selects none",
         "versions that exist"),
        ('source = "seed-mlp"\n[batching]\nmax_batch = 4\n', "table [batching]",
         "max_batch_size"),
        ('source = "seed-mlp"\nweights = "a/b.pt"\n', "field 'weights'", "file's name"),
    ],
)  # fmt: skip
def test_errors_name_the_file_the_field_and_the_fix(
    tmp_path: Path, config: str, field: str, fix: str
) -> None:
    write_model(tmp_path, "m", config=config)
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "m")
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "m" / "config.toml"))
    assert field in message
    assert fix in message


def test_no_version_directory_and_no_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.toml").write_text('source = "seed-mlp"\n')
    with pytest.raises(ConfigError, match="no numbered version directory; create"):
        read_model(tmp_path, "m")
    (tmp_path / "n" / "1").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"config\.toml is missing; write one"):
        read_model(tmp_path, "n")
    with pytest.raises(ConfigError, match="model 'zz' is not in the repository"):
        read_model(tmp_path, "zz")


def test_kserve_layout_model_files_in_the_directory_itself(tmp_path: Path) -> None:
    folder = tmp_path / "iris"
    folder.mkdir()
    (folder / "model.pt2").write_bytes(b"")
    model = read_model(tmp_path, "iris")
    assert model.versions == ("1",)
    assert model.version_settings("1")["exported"] == str(folder / "model.pt2")


def test_model_names_skip_hidden_and_files(tmp_path: Path) -> None:
    for name in ("b", "a", ".cache"):
        (tmp_path / name).mkdir()
    (tmp_path / "README").write_text("")
    assert model_names(tmp_path) == ["a", "b"]
    with pytest.raises(ConfigError, match="is not a directory"):
        model_names(tmp_path / "README")


def test_inline_config_in_triton_s_shape_is_mapped() -> None:
    triton = {
        "name": "m",
        "max_batch_size": 8,
        "dynamic_batching": {"max_queue_delay_microseconds": 500},
        "version_policy": {"latest": {"num_versions": 2}},
        "instance_group": [{"kind": "KIND_CPU", "count": 3}],
        "input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [8]}],
        "parameters": {"source": {"string_value": "seed-mlp"}},
    }
    settings = triton_settings(orjson.dumps(triton).decode())
    assert settings == {
        "batching": {"max_batch_size": 8, "max_delay_ms": 0.5},
        "version_policy": {"latest": 2},
        "replicas": 3,
        "devices": ["cpu"],
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}],
        "source": "seed-mlp",
    }
    assert inline_config({}) is None
    assert inline_config({"parameters": {}}) is None
    assert inline_config({"parameters": {"config": '{"replicas": 2}'}}) == {"replicas": 2}
    with pytest.raises(ConfigError, match="inline config is not JSON"):
        inline_config({"parameters": {"config": "{"}})


def test_inline_config_takes_integers_written_as_strings() -> None:
    """protobuf's JSON mapping writes int64 fields as strings (tritonclient's
    get_model_config(as_json=True) returns them so); Triton's examples send them so."""
    triton = {
        "max_batch_size": "16",
        "dynamic_batching": {"max_queue_delay_microseconds": "100"},
        "input": [{"name": "input", "data_type": "TYPE_FP32", "dims": ["8"]}],
        "version_policy": {"specific": {"versions": ["1", 2]}},
    }
    settings = triton_settings(orjson.dumps(triton).decode())
    assert settings["batching"] == {"max_batch_size": 16, "max_delay_ms": 0.1}
    assert settings["inputs"][0]["shape"] == [-1, 8]
    assert settings["version_policy"] == {"specific": [1, 2]}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"dynamic_batching": 5}, "dynamic_batching must be an object"),
        ({"version_policy": {"specific": {"versions": ["x"]}}}, "must be an integer, not 'x'"),
        ({"input": 5}, "input must be an array"),
        ({"input": [{"name": "x"}]}, "input\\[0\\] needs a 'name' and a 'data_type'"),
        ({"max_batch_size": 1.5}, "max_batch_size must be an integer"),
        ({"instance_group": [{"count": "two"}]}, "instance_group\\[0\\].count"),
    ],
)
def test_an_inline_config_of_the_wrong_shape_is_a_config_error(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        triton_settings(orjson.dumps(config).decode())


@pytest.mark.parametrize(
    "config", ['{"source": "os:abort"}', '{"parameters": {"source": {"string_value": "sys:exit"}}}']
)
def test_a_load_request_does_not_choose_code_to_run(config: str) -> None:
    with pytest.raises(ConfigError, match="does not choose code to import and run"):
        inline_config({"parameters": {"config": config}})
    assert inline_config({"parameters": {"config": '{"source": "wide-mlp"}'}}) == {
        "source": "wide-mlp"
    }


@pytest.mark.parametrize(
    ("triton", "message"),
    [
        ({"max_batch_size": 4097}, "batches of at most 4096 rows, not 4097"),
        (  # 1 GiB and 4 bytes: one row of 2**28 + 1 floats
            {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2**28 + 1]}]},
            "would stage 1,073,741,828 bytes",
        ),
        (  # 64 rows of 2**22 floats in and out: 2 GiB
            {
                "max_batch_size": 64,
                "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2**22]}],
                "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2**22]}],
            },
            "would stage 2,147,483,648 bytes",
        ),
    ],
)
def test_an_inline_config_may_not_ask_for_an_unbounded_batch(
    triton: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        inline_config({"parameters": {"config": orjson.dumps(triton).decode()}})
    within = {"max_batch_size": 4096, "input": [{"name": "x", "data_type": "TYPE_FP32",
                                                  "dims": [2**16]}]}  # fmt: skip
    assert inline_config({"parameters": {"config": orjson.dumps(within).decode()}})


def test_model_files_in_a_load_request_are_refused() -> None:
    body = {"parameters": {"config": "{}", "file:1/model.safetensors": "YQ=="}}
    with pytest.raises(ConfigError, match=r"file:1/model\.safetensors: model files sent with"):
        inline_config(body)


@pytest.mark.parametrize("name", ["../other", "..", "a/b", ""])
def test_a_name_outside_the_repository_is_refused(tmp_path: Path, name: str) -> None:
    write_model(tmp_path, "other")
    with pytest.raises(ConfigError, match="is not a directory name of the repository"):
        read_model(tmp_path / "repo", name)


def test_inline_config_overrides_the_file(tmp_path: Path) -> None:
    write_model(tmp_path, "m")
    model = read_model(tmp_path, "m", {"replicas": 2})
    assert model.settings["replicas_per_device"] == 2
    assert model.source.endswith("config.toml with the inline config")


def test_kserve_layout_with_a_torchplace_toml(tmp_path: Path) -> None:
    folder = tmp_path / "seed"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "torchplace.toml").write_text('model = "seed-mlp"\nmax-batch-size = 4\n')
    model = read_model(tmp_path, "seed")
    assert model.settings == {"model": "seed-mlp", "max_batch_size": 4}
    assert model.version_settings("1")["weights"] == str(folder / "model.safetensors")
    (folder / "torchplace.toml").write_text('model = "seed-mlp"\nport = 9\n')
    with pytest.raises(ConfigError, match=r"torchplace\.toml: field 'port' is not a setting"):
        read_model(tmp_path, "seed")
