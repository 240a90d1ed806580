"""Variable dimensions (``-1`` in Triton's ``dims``): a config.pbtxt, a config.toml and a load's
inline config declaring them load and serve; requests of any length are answered as the model
answers them, the metadata and config say ``-1`` as Triton does, and a request whose shape does
not fit the declared dims is refused (400) naming the shape expected."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.errors import ConfigError
from torchplace.serve.repository import inline_config, read_model, triton_settings
from torchplace.serve.running import ServerThread

from .conftest import test_config
from .repository_helpers import call, triton_model
from .variable_model import RowSum, Tokens

# torch 2.13 deprecates TorchScript (DeprecationWarning; 2.14's FutureWarning is in pyproject)
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.[a-z_]+` is deprecated")

ROWSUM = """name: "rowsum"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""

TOKENS = """platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]
"""

#: a Python model (config.toml's source) whose tensors a load's inline config declares
PYTHON = 'source = "tests.serve.variable_model:row_sum"\n'
INLINE = {
    "max_batch_size": 8,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "total", "data_type": "TYPE_FP32", "dims": ["1"]}],
}


def body(name: str, x: np.ndarray) -> bytes:
    entry = {"name": name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return orjson.dumps({"inputs": [entry]})


def infer(port: int, model: str, name: str, x: np.ndarray) -> tuple[int, Any]:
    return call(port, "POST", f"/v2/models/{model}/infer", body(name, x))


def output(answer: dict[str, Any]) -> np.ndarray:
    (out,) = answer["outputs"]
    got: np.ndarray = np.asarray(out["data"], np.float32).reshape(out["shape"])
    return got


def rows(count: int, length: int, features: int | None = None) -> np.ndarray:
    shape = (count, length) if features is None else (count, length, features)
    return np.random.default_rng(count * 100 + length).standard_normal(shape).astype(np.float32)


# -- reading ------------------------------------------------------------------------------


def test_variable_dims_are_read_from_a_config_pbtxt(tmp_path: Path) -> None:
    triton_model(tmp_path, "rowsum", ROWSUM, RowSum())
    triton_model(tmp_path, "tokens", TOKENS, Tokens())
    rowsum = read_model(tmp_path, "rowsum").version_settings("1")
    assert rowsum["inputs"] == [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, -1]}]
    assert rowsum["outputs"] == [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 1]}]
    tokens = read_model(tmp_path, "tokens").version_settings("1")
    assert tokens["inputs"][0]["shape"] == [-1, -1, 16]
    assert tokens["outputs"][0]["shape"] == [-1, -1, 16]
    # the settings hold as the server's configuration
    config = test_config(model_repository=tmp_path).with_overrides(tokens)
    assert config.inputs is not None
    assert config.inputs[0].shape == (-1, -1, 16)


def test_variable_dims_are_read_from_an_inline_config() -> None:
    # protobuf's JSON writes int64 fields as strings: "-1" is -1
    settings = triton_settings(json.dumps({
        "input": [{"name": "ids", "data_type": "TYPE_INT64", "dims": ["-1"]}],
        "output": [{"name": "out", "data_type": "TYPE_FP32", "dims": [-1, 16]}],
    }))  # fmt: skip
    assert settings["inputs"] == [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]
    assert settings["outputs"] == [{"name": "out", "datatype": "FP32", "shape": [-1, -1, 16]}]


def test_a_config_toml_declares_a_variable_dimension(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.toml").write_text(
        PYTHON + 'inputs = ["x:FP32:-1,-1"]\noutputs = [{name = "total", datatype = "FP32", '
        "shape = [-1, 1]}]\n"
    )
    settings = read_model(tmp_path, "m").version_settings("1")
    config = test_config(model_repository=tmp_path).with_overrides(settings)
    assert [s.shape for s in config.inputs or ()] == [(-1, -1)]
    assert [s.shape for s in config.outputs or ()] == [(-1, 1)]


def test_a_dimension_below_minus_one_is_refused_naming_the_file(tmp_path: Path) -> None:
    triton_model(tmp_path, "rowsum", ROWSUM.replace("dims: [ -1 ]", "dims: [ -2 ]"), RowSum())
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "rowsum")
    where = str(tmp_path / "rowsum" / "config.pbtxt")
    assert str(caught.value).startswith(f"{where}: input[0].dims [-2] has a dimension below -1")
    assert "inline config" not in str(caught.value)
    doc = {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4, -3]}]}
    with pytest.raises(ConfigError, match=r"^inline config: input\[0\]\.dims \[4, -3\] has a"):
        triton_settings(json.dumps(doc))


@pytest.mark.parametrize(
    ("reshape", "refused"),
    [
        ("[ -1 ]", False),  # the dims themselves: nothing to apply
        ("[ 2, -1 ]", True),  # Triton's check: 1 element then -1 against 2 then -1
    ],
)
def test_a_reshape_of_variable_dims_is_refused_unless_its_sizes_agree(
    tmp_path: Path, reshape: str, refused: bool
) -> None:
    text = ROWSUM.replace("dims: [ -1 ]", f"dims: [ -1 ] reshape: {{ shape: {reshape} }}")
    triton_model(tmp_path, "rowsum", text, RowSum())
    if not refused:
        assert read_model(tmp_path, "rowsum").settings["inputs"][0]["shape"] == [-1, -1]
        return
    with pytest.raises(ConfigError, match=r"has different size for dims and reshape"):
        read_model(tmp_path, "rowsum")


def test_the_inline_batch_bound_counts_a_variable_dimension_as_one_element() -> None:
    # a variable dimension is staged per batch at the size requests send (each within the
    # request body limit); the bound is on what the load itself allocates: the dry run's row
    def load(dims: list[int]) -> object:
        config = {"max_batch_size": 4096,
                  "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": dims}]}  # fmt: skip
        return inline_config({"parameters": {"config": json.dumps(config)}}, "m")

    assert load([-1]) is not None
    assert load([-1, 16]) is not None
    with pytest.raises(ConfigError, match=r"would stage 2,147,483,648 bytes"):
        load([-1, 1 << 17])  # 4096 rows of 512 KiB, whatever the variable dimension


# -- serving ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("variable-dims")
    triton_model(root, "rowsum", ROWSUM, RowSum())
    triton_model(root, "tokens", TOKENS, Tokens())
    (root / "python" / "1").mkdir(parents=True)
    (root / "python" / "config.toml").write_text(PYTHON)  # its tensors come with its load
    config = test_config(
        device="cpu",
        model_repository=root,
        model_control_mode="explicit",
        load_models=("rowsum", "tokens"),
    )  # gRPC on any free port too
    with ServerThread(config) as thread:
        yield thread


def test_metadata_and_config_say_minus_one_as_triton_does(server: ServerThread) -> None:
    status, meta = call(server.port, "GET", "/v2/models/rowsum")
    assert status == 200, meta
    assert meta["inputs"] == [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, -1]}]
    assert meta["outputs"] == [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 1]}]
    status, doc = call(server.port, "GET", "/v2/models/rowsum/config")
    assert status == 200, doc
    assert doc["input"] == [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [-1]}]
    assert doc["output"] == [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [1]}]
    _, doc = call(server.port, "GET", "/v2/models/tokens/config")
    assert doc["input"][0]["dims"] == [-1, 16]
    assert doc["output"][0]["dims"] == [-1, 16]
    _, meta = call(server.port, "GET", "/v2/models/tokens")
    assert meta["inputs"][0]["shape"] == [-1, -1, 16]


def test_requests_of_different_lengths_are_answered_as_the_model_answers(
    server: ServerThread,
) -> None:
    cases = [("rowsum", rows(n, length)) for n in (1, 3) for length in (1, 4, 9)]
    cases += [("tokens", rows(n, length, 16)) for n in (1, 2) for length in (1, 5)]
    models: dict[str, nn.Module] = {"rowsum": RowSum(), "tokens": Tokens()}

    def one(case: tuple[str, np.ndarray]) -> None:
        model, x = case
        status, answer = infer(server.port, model, "INPUT__0", x)
        assert status == 200, answer
        with torch.no_grad():
            want = models[model](torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(output(answer), want, rtol=1e-5, atol=1e-5)

    for case in cases:  # one at a time, then all at once (batches of mixed lengths)
        one(case)
    with ThreadPoolExecutor(len(cases)) as pool:
        list(pool.map(one, cases * 3))


def test_a_shape_that_does_not_fit_the_dims_is_refused(server: ServerThread) -> None:
    status, answer = infer(server.port, "tokens", "INPUT__0", rows(2, 4, 15))
    assert status == 400, answer
    assert "unexpected shape for input 'INPUT__0'" in answer["error"]
    assert "Expected [-1,-1,16], got [2,4,15]" in answer["error"]
    status, answer = infer(server.port, "rowsum", "INPUT__0", rows(2, 3, 4))
    assert status == 400, answer
    assert "Expected [-1,-1], got [2,3,4]" in answer["error"]
    status, answer = infer(server.port, "rowsum", "INPUT__0", rows(2, 3))
    assert status == 200, answer  # and the model serves on


def test_an_inline_config_with_variable_dims_loads_a_python_model(server: ServerThread) -> None:
    load = orjson.dumps({"parameters": {"config": json.dumps(INLINE)}})
    status, answer = call(server.port, "POST", "/v2/repository/models/python/load", load)
    assert status == 200, answer
    _, doc = call(server.port, "GET", "/v2/models/python/config")
    assert doc["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}]
    for length in (2, 7):
        x = rows(2, length)
        status, answer = infer(server.port, "python", "x", x)
        assert status == 200, answer
        np.testing.assert_allclose(output(answer), x.sum(axis=1, keepdims=True), rtol=1e-5)
    status, answer = infer(server.port, "python", "x", rows(1, 2, 2))
    assert status == 400, answer
    assert "Expected [-1,-1], got [1,2,2]" in answer["error"]


def test_grpc_clients_see_and_send_variable_dims(server: ServerThread) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        meta = client.get_model_metadata("tokens", as_json=True)
        assert [int(d) for d in meta["inputs"][0]["shape"]] == [-1, -1, 16]
        config = client.get_model_config("rowsum", as_json=True)["config"]
        assert [int(d) for d in config["input"][0]["dims"]] == [-1]
        for length in (3, 11):
            x = rows(2, length, 16)
            entry = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
            entry.set_data_from_numpy(x)
            result = client.infer("tokens", [entry])
            np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), 2 * x + 1, rtol=1e-6)
    finally:
        client.close()
