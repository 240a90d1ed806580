"""Four differences from Triton closed, each as Triton behaves:

* ``reshape`` other than ``dims`` (``dims: [ 1 ] reshape: { shape: [ ] }``, what real
  repositories write): was refused; now the client sends and receives ``dims``, the model takes
  and returns the ``reshape`` shape, the batch dimension first. Sizes that do not agree are
  refused in Triton's words; metadata shows ``dims``, ``/config`` both.
* ``optional: true`` on an input: was taken and the input stayed required, without a word; it
  is refused, as Triton's PyTorch backend refuses it, saying what to do instead.
* ``label_filename``: labelled every output of the model; now only the output that names it
  (the others are ranked by index), and ``/config`` (REST and gRPC) shows it there.
* an int64 output declared ``TYPE_INT32``: was cut to 32 bits; the load is refused in
  Triton's words, while a widening (int32 declared ``TYPE_INT64``) still serves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.errors import ConfigError
from torchplace.models import TensorSpec
from torchplace.serve.loader import load_model
from torchplace.serve.repository import read_model, triton_settings
from torchplace.serve.running import ServerThread

from .conftest import test_config
from .repository_helpers import call, triton_model

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.[a-z_]+` is deprecated")


class Grid(nn.Module):
    """Takes a 2x2 grid per row and a scalar per row (rank 1: ``reshape: { shape: [] }``);
    returns the grid transposed and scaled, 2x2, and fails on any other shape."""

    def forward(self, grid: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        assert grid.dim() == 3, "grid not 2x2"
        assert grid.shape[1] == 2, "grid not 2x2"
        assert grid.shape[2] == 2, "grid not 2x2"
        assert scale.dim() == 1, "scale not a scalar per row"
        return grid.transpose(1, 2) * scale[:, None, None]


class Lengths(nn.Module):
    """Takes rows of shape [L, 1] (``dims: [ -1 ] reshape: { shape: [ -1, 1 ] }``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 3, "rows not [L, 1]"
        assert x.shape[2] == 1, "rows not [L, 1]"
        return x.sum(1)


class Flat(nn.Module):
    """Returns rows of 4 where its output's reshape says 2x2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class TwoHeads(nn.Module):
    """Two outputs of three scores each: OUTPUT__0 the input, OUTPUT__1 its negation."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, -x


class Long(nn.Module):
    """An int64 output (what ``torch.argmax`` and most index ops return)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int64) * 3_000_000_000


class Int32(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int32) + 1


GRID = """name: "grid"
platform: "pytorch_libtorch"
max_batch_size: 4
input [
  { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },
  { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } }
]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
"""

LENGTHS = """platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ -1, 1 ] } } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

# the model returns rows of 4, not the 2x2 its output's reshape says
FLAT = """platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
"""

HEADS = """platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" },
  { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 3 ] }
]
"""


def _pbtxt(out_type: str) -> str:
    return (
        'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        f'output [ {{ name: "OUTPUT__0" data_type: {out_type} dims: [ 2 ] }} ]\n'
    )


def _tensor(name: str, values: np.ndarray, datatype: str = "FP32") -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(values.shape),
        "data": values.ravel().tolist(),
    }


def _infer(port: int, model: str, body: dict[str, Any]) -> tuple[int, Any]:
    return call(port, "POST", f"/v2/models/{model}/infer", orjson.dumps(body))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("fidelity")
    triton_model(root, "grid", GRID, Grid())
    triton_model(root, "lengths", LENGTHS, Lengths())
    triton_model(root, "flat", FLAT, Flat())
    triton_model(root, "heads", HEADS, TwoHeads())
    (root / "heads" / "labels.txt").write_text("cat\ndog\nbird\n")
    triton_model(root, "narrowed", _pbtxt("TYPE_INT32"), Long())
    triton_model(root, "widened", _pbtxt("TYPE_INT64"), Int32())
    triton_model(root, "same", _pbtxt("TYPE_INT64"), Long())
    config = test_config(device="cpu", model_repository=root, grpc_port=None)  # a free port
    with ServerThread(config) as thread:
        yield thread


def _index(server: ServerThread) -> dict[str, dict[str, Any]]:
    _, index = call(server.port, "POST", "/v2/repository/index", b"{}")
    return {entry["name"]: entry for entry in index}


# -- 1. reshape ---------------------------------------------------------------------------


def test_a_reshape_serves_the_model_its_shape_and_the_client_the_dims(
    server: ServerThread,
) -> None:
    grid = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
    scale = np.array([[1.0], [10.0]], np.float32)
    body = {"inputs": [_tensor("INPUT__0", grid), _tensor("INPUT__1", scale)]}
    status, answer = _infer(server.port, "grid", body)
    assert status == 200, answer
    (out,) = answer["outputs"]
    assert out["shape"] == [2, 4]  # the dims, batch first: not [2, 2, 2]
    want = (grid.reshape(2, 2, 2).transpose(0, 2, 1) * scale[:, :, None]).reshape(2, 4)
    assert out["data"] == want.ravel().tolist()


def test_a_reshape_keeps_dims_in_metadata_and_both_in_config(server: ServerThread) -> None:
    _, meta = call(server.port, "GET", "/v2/models/grid")
    assert [i["shape"] for i in meta["inputs"]] == [[-1, 4], [-1, 1]]
    assert meta["outputs"][0]["shape"] == [-1, 4]
    _, config = call(server.port, "GET", "/v2/models/grid/config")
    assert [(i["dims"], i["reshape"]) for i in config["input"]] == [
        ([4], {"shape": [2, 2]}),
        ([1], {"shape": []}),
    ]
    assert config["output"][0]["reshape"] == {"shape": [2, 2]}


def test_a_reshape_with_a_variable_dimension_takes_its_size_from_the_request(
    server: ServerThread,
) -> None:
    for length in (1, 3, 5):
        x = np.arange(2 * length, dtype=np.float32).reshape(2, length)
        status, answer = _infer(server.port, "lengths", {"inputs": [_tensor("INPUT__0", x)]})
        assert status == 200, answer
        assert answer["outputs"][0]["data"] == x.sum(1).tolist()


def test_a_model_that_returns_another_shape_than_its_reshape_does_not_load(
    server: ServerThread,
) -> None:
    flat = _index(server)["flat"]
    assert flat["state"] == "UNAVAILABLE"
    words = "output 'OUTPUT__0': the model returned rows of shape [4], where its reshape says"
    assert words in flat["reason"]


@pytest.mark.parametrize(
    ("tensor", "words"),
    [
        ("dims: [ 4 ] reshape: { shape: [ 3 ] }",
         "input[0]: model input 'x' has different size for dims and reshape"),
        ("dims: [ 2 ] reshape: { shape: [ ] }",
         "input[0]: model input 'x' has different size for dims and reshape"),
        ("dims: [ -1 ] reshape: { shape: [ -1, -1 ] }",
         "has different number of variable-size dimensions for dims and reshape"),
        ("dims: [ 4 ] reshape: { shape: [ 0, 4 ] }", "reshape dimensions must be integer >= 1"),
    ],
)  # fmt: skip
def test_a_reshape_of_another_size_is_refused_in_triton_s_words(
    tmp_path: Path, tensor: str, words: str
) -> None:
    pbtxt = (
        'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        f'input [ {{ name: "x" data_type: TYPE_FP32 {tensor} }} ]\n'
    )
    triton_model(tmp_path, "m", pbtxt, Flat())
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "m")
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "m" / "config.pbtxt"))
    assert words in message
    assert "give reshape.shape the model's shape of one row" in message


def test_an_output_reshape_of_another_size_is_refused_naming_the_output() -> None:
    doc = {"output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [6],
                       "reshape": {"shape": [4]}}]}  # fmt: skip
    with pytest.raises(ConfigError, match=r"^inline config: output\[0\]: model output 'y' has "):
        triton_settings(json.dumps(doc))


def test_a_python_declaration_s_reshape_is_checked_and_applied() -> None:
    bad = TensorSpec("grid", "FP32", (-1, 4), reshape=(3,))
    with pytest.raises(ConfigError, match="model input 'grid' of 'm' has different size"):
        load_model("tests.serve.test_triton_fidelity:Flat", name="m", inputs=(bad,))
    good = (TensorSpec("grid", "FP32", (-1, 4), reshape=(2, 2)),
            TensorSpec("scale", "FP32", (-1, 1), reshape=()))  # fmt: skip
    loaded = load_model("tests.serve.test_triton_fidelity:Grid", name="m", inputs=good)
    # the outputs of the dry run: what the model returns (no reshape of theirs)
    assert loaded.outputs == (TensorSpec("output", "FP32", (-1, 2, 2)),)
    got = loaded.module(torch.arange(4.0).reshape(1, 4), torch.ones(1, 1))
    assert got.tolist() == [[[0.0, 2.0], [1.0, 3.0]]]


# -- 2. optional inputs --------------------------------------------------------------------


def test_an_optional_input_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    pbtxt = _pbtxt("TYPE_FP32").replace("dims: [ 2 ] }", "dims: [ 2 ] optional: true }", 1)
    triton_model(tmp_path, "m", pbtxt, Flat())
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "m")
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "m" / "config.pbtxt"))
    # Triton's PyTorch backend's words, then the fix
    assert (
        "'optional' is set to true for input 'INPUT__0' while the backend model doesn't "
        "support optional input" in message
    )
    assert "remove optional and have clients send the input every time" in message


def test_optional_false_loads_and_an_inline_optional_is_refused_too(tmp_path: Path) -> None:
    pbtxt = _pbtxt("TYPE_FP32").replace("dims: [ 2 ] }", "dims: [ 2 ] optional: false }", 1)
    triton_model(tmp_path, "m", pbtxt, Flat())
    assert read_model(tmp_path, "m").settings["inputs"][0]["name"] == "INPUT__0"
    doc = {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2], "optional": True}]}
    with pytest.raises(ConfigError, match=r"^inline config: 'optional' is set to true for input"):
        triton_settings(json.dumps(doc))
    doc["input"][0]["optional"] = "yes"
    with pytest.raises(ConfigError, match=r"input\[0\]\.optional must be true or false"):
        triton_settings(json.dumps(doc))


# -- 3. label_filename -----------------------------------------------------------------------


def test_label_filename_labels_only_the_output_that_names_it(server: ServerThread) -> None:
    x = np.array([[0.1, 0.9, 0.3]], np.float32)
    body = {
        "inputs": [_tensor("INPUT__0", x)],
        "outputs": [
            {"name": "OUTPUT__0", "parameters": {"classification": 2}},
            {"name": "OUTPUT__1", "parameters": {"classification": 2}},
        ],
    }
    status, answer = _infer(server.port, "heads", body)
    assert status == 200, answer
    got = {out["name"]: out["data"] for out in answer["outputs"]}
    assert got["OUTPUT__0"] == ["0.900000:1:dog", "0.300000:2:bird"]
    assert got["OUTPUT__1"] == ["-0.100000:0", "-0.300000:2"]  # no labels: indices, as Triton


def test_label_filename_is_in_the_config_of_that_output(server: ServerThread) -> None:
    _, config = call(server.port, "GET", "/v2/models/heads/config")
    first, second = config["output"]
    assert first["label_filename"] == "labels.txt"
    assert "label_filename" not in second
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        message = client.get_model_config("heads").config
        assert [o.label_filename for o in message.output] == ["labels.txt", ""]
        grid = client.get_model_config("grid").config
        assert list(grid.input[0].reshape.shape) == [2, 2]
        assert grid.input[1].HasField("reshape")
        assert list(grid.input[1].reshape.shape) == []
    finally:
        client.close()


def test_a_label_filename_that_is_not_a_file_name_is_refused(tmp_path: Path) -> None:
    triton_model(tmp_path, "m", HEADS.replace('"labels.txt"', '"../labels.txt"'), TwoHeads())
    with pytest.raises(ConfigError, match=r"label_filename of output 'OUTPUT__0' = '\.\./"):
        read_model(tmp_path, "m")


# -- 4. integer outputs of another width ---------------------------------------------------


def test_an_int64_output_declared_int32_is_refused_in_triton_s_words(
    server: ServerThread,
) -> None:
    narrowed = _index(server)["narrowed"]
    assert narrowed["state"] == "UNAVAILABLE"
    assert (
        "configuration expects datatype TYPE_INT32 for output 'OUTPUT__0', model provides "
        "TYPE_INT64" in narrowed["reason"]
    )


def test_an_int32_output_declared_int64_is_widened_and_served(server: ServerThread) -> None:
    x = np.array([[1.0, 2.0]], np.float32)
    status, answer = _infer(server.port, "widened", {"inputs": [_tensor("INPUT__0", x)]})
    assert status == 200, answer
    assert (answer["outputs"][0]["datatype"], answer["outputs"][0]["data"]) == ("INT64", [2, 3])
    status, answer = _infer(server.port, "same", {"inputs": [_tensor("INPUT__0", x)]})
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [3_000_000_000, 6_000_000_000]  # whole, not cut
