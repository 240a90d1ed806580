"""Triton's ``max_batch_size: 0`` ("no batching"): the model takes each request's tensors as
sent, ``dims`` being the whole shape. Triton's own PyTorch quick-start (``dims: [ 3, 224, 224 ]``
with ``reshape { shape: [ 1, 3, 224, 224 ] }``) was refused; it now serves, each request one
call of the model, never batched with another."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.serve.repository import inline_config
from torchplace.serve.running import ServerThread

from .conftest import test_config
from .repository_helpers import call, triton_model

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.[a-z_]+` is deprecated")


class Image(nn.Module):
    """Takes exactly one image [1, 3, H, W] (what the quick-start's reshape gives it) and
    returns [1, 10]; fails on a batch of any other size."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 4, "not an image batch [1, 3, H, W]"
        assert x.shape[0] == 1, "more than one image"
        return self.fc(x.mean((2, 3)))


class Tokens(nn.Module):
    """Takes the tokens of one request as sent, [N, 4] for any N, and returns them doubled;
    counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = nn.Buffer(torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 2, "not [N, 4]"
        self.calls += 1
        return x * 2


QUICK_START = """name: "resnet"
platform: "pytorch_libtorch"
max_batch_size : 0
input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 3, 8, 8 ]
          reshape { shape: [ 1, 3, 8, 8 ] } } ]
output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1, 10, 1, 1 ]
           reshape { shape: [ 1, 10 ] } } ]
"""

TOKENS = """platform: "pytorch_libtorch"
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Path]]:
    root = tmp_path_factory.mktemp("unbatched")
    torch.manual_seed(0)
    triton_model(root, "resnet", QUICK_START, Image())
    triton_model(root, "tokens", TOKENS, Tokens())  # max_batch_size left out: Triton's 0
    config = test_config(device="cpu", model_repository=root, grpc_port=None)  # a free port
    with ServerThread(config) as thread:
        yield thread, root


def _infer(port: int, model: str, name: str, x: np.ndarray) -> tuple[int, Any]:
    body = {"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape),
                        "data": x.ravel().tolist()}]}  # fmt: skip
    return call(port, "POST", f"/v2/models/{model}/infer", orjson.dumps(body))


def _expected(root: Path, x: np.ndarray) -> np.ndarray:
    model = torch.jit.load(str(root / "resnet" / "1" / "model.pt"))  # type: ignore[no-untyped-call]
    with torch.inference_mode():
        return np.asarray(model(torch.from_numpy(x)[None]).numpy()).reshape(1, 10, 1, 1)


def test_triton_s_pytorch_quick_start_serves_its_dims(
    server: tuple[ServerThread, Path],
) -> None:
    thread, root = server
    x = np.random.default_rng(1).random((3, 8, 8), dtype=np.float32)
    status, answer = _infer(thread.port, "resnet", "input__0", x)
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["shape"] == [1, 10, 1, 1]
    got = np.asarray(output["data"], np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, _expected(root, x), rtol=1e-5, atol=1e-6)
    _, metadata = call(thread.port, "GET", "/v2/models/resnet")
    assert metadata["inputs"][0]["shape"] == [3, 8, 8]
    assert metadata["outputs"][0]["shape"] == [1, 10, 1, 1]
    _, config = call(thread.port, "GET", "/v2/models/resnet/config")
    assert config["max_batch_size"] == 0
    assert "dynamic_batching" not in config
    assert config["input"][0]["dims"] == [3, 8, 8]
    # the config read back loads again as it is (what a client that copies it sends)
    assert inline_config({"parameters": {"config": orjson.dumps(config).decode()}}, "resnet")


def test_a_batch_dimension_the_config_does_not_have_is_refused(
    server: tuple[ServerThread, Path],
) -> None:
    thread, _ = server
    x = np.zeros((1, 3, 8, 8), np.float32)
    status, answer = _infer(thread.port, "resnet", "input__0", x)
    assert status == 400
    assert answer["error"].endswith("Expected [3,8,8], got [1,3,8,8]"), answer  # no batch clause
    status, answer = call(thread.port, "POST", "/v1/models/resnet:predict",
                          orjson.dumps({"instances": [x[0].tolist()]}))  # fmt: skip
    assert status == 400
    assert "takes whole tensors" in answer["error"]


def test_tritonclient_over_grpc_and_binary_http(server: tuple[ServerThread, Path]) -> None:
    thread, root = server
    x = np.random.default_rng(2).random((3, 8, 8), dtype=np.float32)
    for kind in ("http", "grpc"):
        module: Any = pytest.importorskip(f"tritonclient.{kind}")
        port = thread.port if kind == "http" else thread.grpc_port
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            given = module.InferInput("input__0", [3, 8, 8], "FP32")
            given.set_data_from_numpy(x)
            got = client.infer("resnet", [given]).as_numpy("output__0")
            np.testing.assert_allclose(got, _expected(root, x), rtol=1e-5, atol=1e-6)
            metadata = client.get_model_metadata("resnet")
            inputs = metadata["inputs"] if kind == "http" else metadata.inputs
            shape = inputs[0]["shape"] if kind == "http" else inputs[0].shape
            assert [int(d) for d in shape] == [3, 8, 8]
        finally:
            client.close()


def test_each_request_is_one_call_never_batched_with_another(
    server: tuple[ServerThread, Path],
) -> None:
    """Requests of several lengths at once: each answered with its own tensor doubled, as
    many model calls as requests (a second request in the call would fail the model's
    check or be dropped)."""
    thread, _ = server
    before = _tokens_calls(thread)
    lengths = [1, 3, 3, 5, 2, 3, 7, 1]
    inputs = [np.full((n, 4), float(i), np.float32) for i, n in enumerate(lengths)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: _infer(thread.port, "tokens", "INPUT__0", x), inputs))
    for x, (status, answer) in zip(inputs, answers, strict=True):
        assert status == 200, answer
        (output,) = answer["outputs"]
        assert output["shape"] == list(x.shape)
        np.testing.assert_array_equal(np.asarray(output["data"]).reshape(x.shape), x * 2)
    assert _tokens_calls(thread) - before == len(lengths)


def _tokens_calls(thread: ServerThread) -> int:
    _, stats = call(thread.port, "GET", "/v2/models/tokens/stats")
    entry = stats["model_stats"][0]
    assert entry["inference_count"] == entry["execution_count"]  # one request, one execution
    return int(entry["execution_count"])


def test_the_first_dimension_is_the_model_s_not_bounded_as_rows(
    server: tuple[ServerThread, Path],
) -> None:
    """--max-request-rows (4096) bounds a batched request's rows; here the first dimension
    is the model's own (a sequence of 5000), bounded by the body's byte limit alone."""
    thread, _ = server
    x = np.ones((5000, 4), np.float32)
    status, answer = _infer(thread.port, "tokens", "INPUT__0", x)
    assert status == 200, answer
    assert answer["outputs"][0]["shape"] == [5000, 4]
