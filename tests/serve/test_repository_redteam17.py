"""Red team round 17, the model repository: a load whose dry run would allocate gigabytes, a
version number past 64 bits, a model moved out of a polled repository and back, a version
directory the server may not read, a directory name that is not UTF-8, a version policy past
its proto field, and an input without a name or labels read from the model's own config.
Each is refused (or skipped) naming the value and the fix, and the other models serve on."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from torchplace.errors import ConfigError
from torchplace.models import TensorSpec
from torchplace.serve import repository
from torchplace.serve.config import MAX_ROW_ELEMENTS, ServeConfig
from torchplace.serve.loader import load_model
from torchplace.serve.memory import estimate
from torchplace.serve.registry import ModelHandle, Registry
from torchplace.serve.reload import ModelControl
from torchplace.serve.replica import Replica
from torchplace.serve.repository import check_model_name, inline_config, read_model
from torchplace.serve.running import ServerThread

from .conftest import test_config
from .repository_helpers import call, infer_body, write_model

BODY = orjson.dumps(infer_body())
SEED = 'source = "seed-mlp"\n'  # the server's batch: 32 rows
LOAD = "/v2/repository/models/{}/load"


def _explicit(root: Path, **overrides: Any) -> ServeConfig:
    settings: dict[str, Any] = {"device": "cpu", "model_repository": root, "grpc_port": 0,
                                "model_control_mode": "explicit", "load_models": ("*",)}  # fmt: skip
    return test_config(**{**settings, **overrides})


def _load(port: int, name: str, config: dict[str, Any] | None = None) -> tuple[int, Any]:
    body = {} if config is None else {"parameters": {"config": json.dumps(config)}}
    return call(port, "POST", LOAD.format(name), orjson.dumps(body))


def _index(port: int) -> list[dict[str, str]]:
    entries: list[dict[str, str]] = call(port, "POST", "/v2/repository/index", b"{}")[1]
    return entries


def _until(condition: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# -- 1: a dry run bounded before it runs ---------------------------------------------------

#: a row of 100,000 floats (400 kB): 32 rows are 12.8 MB, past the 1 MiB the tests set
_ROW = 100_000


@pytest.fixture
def dry_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every replica dry run from now on: its model and rows."""
    seen: list[tuple[str, int]] = []
    original = Replica.dry_run

    def counted(self: Replica, rows: int) -> dict[str, tuple[int, ...]]:
        seen.append((self.loaded.name, rows))
        return original(self, rows)

    monkeypatch.setattr(Replica, "dry_run", counted)
    return seen


@pytest.mark.parametrize(
    "warmup",
    [
        {"model_warmup": [{"name": "w", "batch_size": 1, "inputs": {"input": {
            "data_type": "TYPE_FP32", "dims": [_ROW], "zero_data": True}}}]},
        {"dry_run_shapes": {"input": [_ROW]}},
    ],
    ids=["model_warmup", "dry_run_shapes"],
)  # fmt: skip
def test_an_inline_warmup_past_the_batch_limit_is_refused_before_any_dry_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dry_runs: list[tuple[str, int]],
    warmup: dict[str, Any],
) -> None:
    """A variable dimension counted as 1 let a 270-byte load make each replica dry-run
    max_batch_size rows of the warm-up's dims (125M floats: 16 GB). The batch is counted at
    the server's 32 rows and the warm-up's row, and refused before anything is allocated
    (the limit scaled down to 1 MiB so that the old code's dry run stays small)."""
    monkeypatch.setattr(repository, "MAX_INLINE_BATCH_BYTES", 1 << 20)
    write_model(tmp_path, "seed", config=SEED, weights=False)
    config = {"input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [-1]}], **warmup}
    with ServerThread(_explicit(tmp_path)) as thread:
        dry_runs.clear()
        status, body = _load(thread.port, "seed", config)
        assert status == 400, body
        assert body["error"].startswith("failed to load 'seed': ")
        assert f"would stage {32 * (4 * _ROW + 8):,} bytes" in body["error"]  # in and out
        assert "32 rows" in body["error"]
        assert dry_runs == []  # refused before any replica ran
        assert call(thread.port, "POST", "/v2/models/seed/infer", BODY)[0] == 200


def test_the_memory_estimate_counts_the_dry_run_s_row_shape() -> None:
    """A model that cannot run on meta (seed-mlp on rows of 1,000) is counted with its inputs
    and outputs: at the row its dry run gets, not each variable dimension 1."""
    loaded = load_model("seed-mlp", inputs=(TensorSpec("input", "FP32", (-1, -1)),),
                        dry_run_shapes={"input": (1000,)})  # fmt: skip
    rows = 32
    assert estimate(loaded, rows) == loaded.weight_bytes + rows * (4 * 1000 + 4 * 2)


def test_a_config_file_s_dry_run_past_the_memory_budget_is_a_409(
    tmp_path: Path, dry_runs: list[tuple[str, int]]
) -> None:
    """The same dry run from a config.toml is the operator's to ask for, within
    --memory-budget: the estimate counts it (12.8 MB) and the load is refused with the
    numbers before any replica dry-runs it."""
    config = SEED + 'inputs = ["input:FP32:-1,-1"]\n' + f"dry_run_shapes = {{ input = [{_ROW}] }}\n"
    write_model(tmp_path, "big", config=config, weights=False)
    write_model(tmp_path, "seed", config=SEED, weights=False)
    server = _explicit(tmp_path, load_models=("seed",), memory_budget=4 << 20)
    with ServerThread(server) as thread:
        dry_runs.clear()
        status, body = _load(thread.port, "big")
        assert status == 409, body
        assert "model 'big' needs" in body["error"]
        assert "raise --memory-budget" in body["error"]
        assert dry_runs == []
        assert call(thread.port, "POST", "/v2/models/seed/infer", BODY)[0] == 200


def test_a_dry_run_shape_has_the_row_limit_of_a_declaration() -> None:
    with pytest.raises(ConfigError, match=f"more than {MAX_ROW_ELEMENTS:,} elements"):
        ServeConfig(dry_run_shapes={"input": (1 << 16, 1 << 16)})
    with pytest.raises(ConfigError, match="dry_run_shapes of 'input'"):
        ServeConfig.from_mapping({"dry_run_shapes": ["input:125000000,125000000"]})
    assert ServeConfig(dry_run_shapes={"input": (1 << 16,)}).dry_run_shapes == {"input": (1 << 16,)}


# -- 2: a version number past 64 bits ------------------------------------------------------

_HUGE = "[version_policy]\nspecific = [1, 99999999999999999999]\n"


def test_a_version_past_64_bits_names_the_file_and_the_field(tmp_path: Path) -> None:
    write_model(tmp_path, "spec", config=SEED + _HUGE, weights=False)
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "spec")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'spec' / 'config.toml'}: version_policy.specific")
    assert "specific versions in 0..9,223,372,036,854,775,807" in message
    write_model(tmp_path, "latest", config=SEED + "[version_policy]\nlatest = 5000000000\n")
    with pytest.raises(ConfigError, match=r"version_policy.latest = 5000000000 is invalid"):
        read_model(tmp_path, "latest")


def test_a_version_past_64_bits_leaves_the_other_models_serving(tmp_path: Path) -> None:
    """Mode none: the whole server died at start (TypeError: Integer exceeds 64-bit range)."""
    write_model(tmp_path, "ok", config=SEED, weights=False)
    write_model(tmp_path, "spec", config=SEED + _HUGE, weights=False)
    config = test_config(device="cpu", model_repository=tmp_path, grpc_port=0)
    with ServerThread(config) as thread:
        assert call(thread.port, "POST", "/v2/models/ok/infer", BODY)[0] == 200
        bad = [e for e in _index(thread.port) if e["name"] == "spec"]
        assert [e["state"] for e in bad] == ["UNAVAILABLE"]
        assert "config.toml: version_policy.specific" in bad[0]["reason"]


def test_a_load_that_fails_after_its_build_releases_what_it_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anything failing after a version is built (here the policy's document) releases it:
    its engine stopped and its memory reservation dropped, where they leaked, unreachable by
    an unload, and the index showed it LOADING for good."""
    write_model(tmp_path, "seed", config=SEED, weights=False)
    stopped: list[ModelHandle] = []

    def broken(self: ModelHandle, policy: dict[str, Any]) -> None:
        stopped.append(self)
        raise TypeError("Integer exceeds 64-bit range")

    async def scenario() -> tuple[ModelControl, str]:
        control = ModelControl(Registry(), _explicit(tmp_path, load_models=()))
        await control.start()
        monkeypatch.setattr(ModelHandle, "set_policy", broken)
        try:
            await control.load("seed")
        except Exception as exc:  # what the load answers is checked below
            return control, str(exc)
        return control, ""

    control, error = asyncio.run(scenario())
    assert error.startswith("load failed for model 'seed': version 1 is at UNAVAILABLE state")
    assert len(stopped) == 1
    assert not stopped[0].engine.is_live()  # stopped: its replicas' threads ended
    assert control.memory.reserved == {}
    assert [e["state"] for e in control.registry.index()] == ["UNAVAILABLE"]


# -- 3 and 4: polling ----------------------------------------------------------------------


def _poll(root: Path) -> ServeConfig:
    return test_config(device="cpu", model_repository=root, model_control_mode="poll",
                       repository_poll_secs=0.1, grpc_port=0)  # fmt: skip


def _serves(thread: ServerThread, name: str) -> Callable[[], bool]:
    return lambda: call(thread.port, "POST", f"/v2/models/{name}/infer", BODY)[0] == 200


def test_poll_mode_loads_a_model_moved_out_and_back_unchanged(tmp_path: Path) -> None:
    """``mv`` keeps mtimes: the fingerprint of the model moved back is the one remembered
    from before, so it was never loaded again (404 for good)."""
    root = tmp_path / "repo"
    write_model(root, "a", config=SEED, weights=False)
    write_model(root, "b", config=SEED, weights=False)
    with ServerThread(_poll(root)) as thread:
        shutil.move(root / "a", tmp_path / "away")
        _until(lambda: not _serves(thread, "a")(), "a was not unloaded")
        shutil.move(tmp_path / "away", root / "a")
        _until(_serves(thread, "a"), "a moved back was never loaded again")
        assert {"name": "a", "version": "1", "state": "READY", "reason": ""} in _index(thread.port)


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch) -> set[Path]:
    """Directories listed as the server, not root, would list one it may not read (tests run
    as root, who reads anything): PermissionError. Empty the set to make them readable."""
    closed: set[Path] = set()
    original = Path.iterdir

    def iterdir(self: Path) -> Iterator[Path]:
        if self in closed:
            raise PermissionError(13, "Permission denied", str(self))
        return original(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    return closed


def test_an_unreadable_version_directory_fails_its_model_alone_at_start(
    tmp_path: Path, unreadable: set[Path]
) -> None:
    """Mode none: the PermissionError out of the fingerprint stopped the whole server."""
    write_model(tmp_path, "a", config=SEED, weights=False)
    unreadable.add(write_model(tmp_path, "b", config=SEED, weights=False) / "1")
    config = test_config(device="cpu", model_repository=tmp_path, grpc_port=0)
    with ServerThread(config) as thread:
        assert _serves(thread, "a")()
        bad = [e for e in _index(thread.port) if e["name"] == "b"]
        assert [e["state"] for e in bad] == ["UNAVAILABLE"]
        assert "cannot read its directory" in bad[0]["reason"]
        assert f"{str(tmp_path / 'b' / '1')!r}: Permission denied" in bad[0]["reason"]
        assert "permissions" in bad[0]["reason"]  # the fix


def test_an_unreadable_version_directory_does_not_stop_polling(
    tmp_path: Path, unreadable: set[Path]
) -> None:
    """The PermissionError ended the poll task unseen: no later change was picked up."""
    write_model(tmp_path, "a", config=SEED, weights=False)
    with ServerThread(_poll(tmp_path)) as thread:
        unreadable.add(tmp_path / "b" / "1")
        write_model(tmp_path, "b", config=SEED, weights=False)

        def shown() -> bool:
            return any("Permission denied" in e.get("reason", "") for e in _index(thread.port)
                       if e["name"] == "b")  # fmt: skip

        _until(shown, "b's reason was not shown")
        write_model(tmp_path, "c", config=SEED, weights=False)
        _until(_serves(thread, "c"), "a model added later was never loaded")
        unreadable.clear()
        (tmp_path / "b" / "1" / "touched").write_text("")  # the directory changes when fixed
        _until(_serves(thread, "b"), "b was not loaded once readable")
        assert _serves(thread, "a")()


def test_a_file_removed_while_the_fingerprint_is_taken_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file listed, then removed before its stat: FileNotFoundError escaped the poll."""
    write_model(tmp_path, "a", config=SEED, weights=False)
    model = read_model(tmp_path, "a")
    gone = tmp_path / "a" / "1" / "gone.safetensors"
    original_iterdir, original_exists = Path.iterdir, Path.exists
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(
        [*original_iterdir(self), *([gone] if self == gone.parent else [])]))  # fmt: skip
    monkeypatch.setattr(Path, "exists", lambda self: self == gone or original_exists(self))
    stamps = model.fingerprint()
    assert all(not (isinstance(s, tuple) and s[0] == str(gone)) for s in stamps)


# -- 5: a directory name that is not UTF-8 -------------------------------------------------


def test_a_name_that_is_not_utf8_is_not_a_model_name() -> None:
    with pytest.raises(ConfigError, match=r"'caf\\udce9' is not UTF-8 text"):
        check_model_name(os.fsdecode(b"caf\xe9"))
    check_model_name("caf\xe9")  # café in UTF-8 is one


def test_a_directory_name_that_is_not_utf8_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its index entry broke the index for every client: REST 500 (orjson refuses the
    surrogate escape), gRPC RepositoryIndex UNKNOWN."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    write_model(tmp_path, "ok", config=SEED, weights=False)
    latin1 = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.makedirs(os.path.join(latin1, b"1"))
    with open(os.path.join(latin1, b"config.toml"), "w") as file:
        file.write(SEED)
    caplog.set_level(logging.WARNING, logger="torchplace.serve.repository")
    config = test_config(device="cpu", model_repository=tmp_path)  # gRPC on a free port
    with ServerThread(config) as thread:
        for _ in range(2):  # the index asked twice
            status, index = call(thread.port, "POST", "/v2/repository/index", b"{}")
            assert status == 200, index
            assert index == [{"name": "ok", "version": "1", "state": "READY", "reason": ""}]
        assert thread.grpc_port is not None
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{thread.grpc_port}")
        models = client.get_model_repository_index(as_json=True)["models"]
        assert [m["name"] for m in models] == ["ok"]
        assert _serves(thread, "ok")()
    skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert len(skipped) == 1  # told once, not at every index and poll
    assert "caf\\udce9" in skipped[0]
    assert "not UTF-8 text" in skipped[0]


# -- 6: numbers past their ModelConfig fields ----------------------------------------------


#: a ModelConfig field of uint32: the inline config that sets it, where the model's document
#: holds it, and the load's error past its range
_UINT32_FIELDS: dict[str, tuple[Callable[[int], Any], Callable[[Any], Any], str]] = {
    "num_versions": (
        lambda n: {"version_policy": {"latest": {"num_versions": n}}},
        lambda doc: doc["version_policy"]["latest"]["num_versions"],
        "version_policy.latest = 5000000000 is invalid (latest in 1..4,294,967,295",
    ),
    "max_queue_size": (
        lambda n: {"dynamic_batching": {"default_queue_policy": {"max_queue_size": n}}},
        lambda doc: doc["dynamic_batching"]["default_queue_policy"]["max_queue_size"],
        "dynamic_batching.default_queue_policy.max_queue_size 5000000000 is past the 4,294,967,295",
    ),
}


@pytest.mark.parametrize("field", sorted(_UINT32_FIELDS))
def test_a_number_past_its_model_config_field_is_refused_and_grpc_serves_on(
    tmp_path: Path, field: str
) -> None:
    """Loaded, they broke the model's gRPC ModelConfig and ModelMetadata (UNKNOWN
    ParseError: the fields are uint32) for every client; the largest value a field holds
    loads, and the model's documents over gRPC state it."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    sent, held, message = _UINT32_FIELDS[field]
    write_model(tmp_path, "seed", config=SEED, weights=False)
    with ServerThread(_explicit(tmp_path, grpc_port=None)) as thread:
        status, body = _load(thread.port, "seed", sent(5000000000))
        assert status == 400, body
        assert body["error"].startswith("failed to load 'seed': ")
        assert message in body["error"]
        status, body = _load(thread.port, "seed", sent(2**32 - 1))
        assert status == 200, body
        assert thread.grpc_port is not None
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{thread.grpc_port}")
        assert client.get_model_metadata("seed", as_json=True)["name"] == "seed"
        assert int(held(client.get_model_config("seed", as_json=True)["config"])) == 2**32 - 1


def test_a_queue_past_uint32_is_refused_as_a_setting() -> None:
    with pytest.raises(ConfigError, match="max_queue=4294967296 is invalid"):
        ServeConfig(max_queue=2**32)
    with pytest.raises(ConfigError, match="priority_queue_limits"):
        ServeConfig(priority_levels=2, priority_queue_limits=(8, 2**32))


# -- minor: an input without a name, labels from the model's own files ----------------------


def test_an_input_without_a_name_is_refused() -> None:
    config = {"input": [{"name": "", "data_type": "TYPE_FP32", "dims": [8]}]}
    with pytest.raises(ConfigError, match=r"input\[0\] needs a 'name'.*must specify 'name'"):
        inline_config({"parameters": {"config": json.dumps(config)}}, "seed")
    with pytest.raises(ConfigError, match="must specify a name"):
        ServeConfig(inputs=({"name": "", "datatype": "FP32", "shape": [-1, 8]},))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "inline",
    [
        {"labels": "config.toml"},
        {"labels": "model.safetensors"},
        {"output": [{"name": "output", "data_type": "TYPE_FP32", "dims": [2],
                     "label_filename": "config.pbtxt"}]},
    ],
    ids=["labels-config", "labels-weights", "label_filename-config"],
)  # fmt: skip
def test_labels_are_not_read_from_the_model_s_config_or_model_files(
    tmp_path: Path, inline: dict[str, Any]
) -> None:
    """A load's inline config read a file of the model directory back to clients, a line a
    class name (the classification extension)."""
    write_model(tmp_path, "seed", config=SEED, weights=False)
    settings = inline_config({"parameters": {"config": json.dumps(inline)}}, "seed")
    with pytest.raises(ConfigError, match="is the model's configuration or a model file"):
        read_model(tmp_path, "seed", settings)
    (tmp_path / "seed" / "labels.txt").write_text("no\nyes\n")
    fine = json.loads(json.dumps(inline).replace(
        '"config.toml"', '"labels.txt"').replace('"model.safetensors"', '"labels.txt"').replace(
        '"config.pbtxt"', '"labels.txt"'))  # fmt: skip
    assert read_model(tmp_path, "seed", inline_config(
        {"parameters": {"config": json.dumps(fine)}}, "seed"))  # fmt: skip
