"""A new user's round: Triton repositories as found in the wild, and docs/serve.md's examples.

* Triton's PyTorch backend gives inputs named as the TorchScript forward's arguments
  (``forward(self, a, b)``, inputs ``b`` then ``a`` in config.pbtxt) to those arguments,
  before its ``NAME__N`` convention and the config's order; torchplace fed them in the
  config's order, so ``a - b`` was answered as ``b - a``, with no error.
* An error raised inside a TorchScript forward was answered with its first line only, which
  says that an operation failed in the TorchScript interpreter and not which or why.
* docs/serve.md's repository example showed an index without ``reason`` and a memory refusal
  for a load that is refused for another reason (an inline ``max_batch_size`` over 4,096).
* ``dynamic_batching {}`` (or none) in config.pbtxt took the server's --max-delay-ms (2 ms a
  request) where Triton's delay is 0.
* A float output declared ``TYPE_INT32`` was cut to whole numbers and answered; Triton
  refuses the mismatch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.errors import ConfigError
from torchplace.serve.failures import describe
from torchplace.serve.running import ServerThread
from torchplace.serve.torchscript import forward_arguments, tensor_order

from .conftest import test_config
from .repository_helpers import call, triton_model

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.[a-z_]+` is deprecated")

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"


class Sub(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - b


class Masked(nn.Module):
    """Two variable-length inputs that must be of one length."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (ids * mask).sum(1, keepdim=True)


# declared in another order than the forward's arguments, and not NAME__N
SUB = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 4
input [ {{ name: "b" data_type: TYPE_FP32 dims: [ 2 ] }},
        {{ name: "a" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "out" data_type: TYPE_FP32 dims: [ 2 ] }} ]
"""

MASKED = """platform: "pytorch_libtorch"
max_batch_size: 8
dynamic_batching {}
input [ { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""


def _save(module: nn.Module, folder: Path, *, trace: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    example = (torch.ones(1, 2), torch.ones(1, 2))
    traced = torch.jit.trace(module, example) if trace else None  # type: ignore[no-untyped-call]
    archive = traced if traced is not None else torch.jit.script(module)
    torch.jit.save(archive, str(folder / "model.pt"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("wild-triton")
    for name, trace in (("sub_script", False), ("sub_trace", True)):
        _save(Sub(), root / name / "1", trace=trace)
        (root / name / "config.pbtxt").write_text(SUB.format(name=name))
    _save(Masked(), root / "masked" / "1", trace=False)
    (root / "masked" / "config.pbtxt").write_text(MASKED)
    with ServerThread(test_config(device="cpu", model_repository=root, grpc_port=0)) as thread:
        yield thread


def _tensor(name: str, datatype: str, values: list[list[float]]) -> dict[str, object]:
    data = np.asarray(values)
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(data.shape),
        "data": data.ravel().tolist(),
    }


@pytest.mark.parametrize("model", ["sub_script", "sub_trace"])
def test_inputs_named_as_the_forward_arguments_go_to_those_arguments(
    server: ServerThread, model: str
) -> None:
    body = {
        "inputs": [
            _tensor("a", "FP32", [[10.0, 10.0]]),
            _tensor("b", "FP32", [[1.0, 2.0]]),
        ]
    }
    status, answer = call(server.port, "POST", f"/v2/models/{model}/infer", orjson.dumps(body))
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [9.0, 8.0]  # a - b, as Triton answers; not b - a


def test_the_forward_argument_order_is_read_from_the_archive(tmp_path: Path) -> None:
    _save(Sub(), tmp_path / "s", trace=False)
    _save(Sub(), tmp_path / "t", trace=True)
    for folder in ("s", "t"):
        script = torch.jit.load(str(tmp_path / folder / "model.pt"))  # type: ignore[no-untyped-call]
        assert forward_arguments(script) == ("a", "b")
    assert forward_arguments(nn.Linear(2, 2)) == ()  # not TorchScript: no schema
    arguments = ("a", "b", "c")
    assert tensor_order(["c", "a", "b"], inputs=True, arguments=arguments) == (1, 2, 0)
    assert tensor_order(["a", "b", "c"], inputs=True, arguments=arguments) is None
    assert tensor_order(["a", "b"], inputs=True, arguments=arguments) is None  # c defaulted
    # forward-argument names win over NAME__N, as in Triton's backend
    assert tensor_order(["x__1", "x__0"], inputs=True, arguments=("x__1", "x__0")) is None
    # inputs not all arguments: NAME__N, else the config's order
    assert tensor_order(["INPUT__1", "INPUT__0"], inputs=True, arguments=arguments) == (1, 0)
    assert tensor_order(["b", "z"], inputs=True, arguments=arguments) is None
    with pytest.raises(ConfigError, match=r"without \['a'\]"):
        tensor_order(["b"], inputs=True, arguments=arguments)


def test_a_torchscript_forward_error_is_told_by_its_own_words(server: ServerThread) -> None:
    good = {"inputs": [_tensor("mask", "INT64", [[1, 0, 1]]), _tensor("ids", "INT64", [[5, 6, 7]])]}
    status, answer = call(server.port, "POST", "/v2/models/masked/infer", orjson.dumps(good))
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [12]
    bad = {"inputs": [_tensor("mask", "INT64", [[1, 0, 1]]), _tensor("ids", "INT64", [[5, 6]])]}
    status, answer = call(server.port, "POST", "/v2/models/masked/infer", orjson.dumps(bad))
    assert status == 500, answer
    assert "The size of tensor a (2) must match the size of tensor b (3)" in answer["error"]


def test_describe_keeps_plain_errors_to_their_first_line() -> None:
    assert describe(ValueError("first\nsecond")) == "ValueError: first"
    assert describe(RuntimeError("")) == "RuntimeError: "
    scripted = RuntimeError(
        "The following operation failed in the TorchScript interpreter.\n"
        "Traceback of TorchScript (most recent call last):\n  ~~~ <--- HERE\n\n"
        "RuntimeError: shapes do not match\n"
    )
    assert describe(scripted) == (
        "RuntimeError: TorchScript forward failed: RuntimeError: shapes do not match"
    )
    assert len(describe(ValueError("x" * 1000))) == 300


def test_the_repository_example_of_docs_serve_answers_as_shown(tmp_path: Path) -> None:
    """The console example under Model repository: its index line and its refused load."""
    text = DOC.read_text()
    start = text.index("$ mkdir -p models/seed/1 models/wide/1")
    example = text[start : text.index("```", start)]
    for name in ("seed", "wide"):
        (tmp_path / name / "1").mkdir(parents=True)
    (tmp_path / "seed" / "config.toml").write_text('source = "seed-mlp"\n')
    (tmp_path / "wide" / "config.toml").write_text(
        'source = "wide-mlp"\n[batching]\nmax_batch_size = 16\n'
    )
    config = test_config(
        device="cpu",
        model_repository=tmp_path,
        model_control_mode="explicit",
        load_models=("*",),
        memory_budget=1 << 30,
    )
    index_shown = re.search(r"repository/index\n(\[.*\])\n", example)
    load_shown = re.search(r"wide/load \\\n +-d '(.*)'\n(\{\"error\":.*\})\n", example)
    assert index_shown, "docs/serve.md's repository example lost its index line"
    assert load_shown, "docs/serve.md's repository example lost its refused load"
    with ServerThread(config) as server:
        status, index = call(server.port, "POST", "/v2/repository/index")
        assert status == 200
        assert index == orjson.loads(index_shown.group(1))
        assert call(server.port, "POST", "/v2/repository/models/wide/unload")[0] == 200
        body = load_shown.group(1).encode()
        status, answer = call(server.port, "POST", "/v2/repository/models/wide/load", body)
    assert status == 409, answer
    shown = orjson.loads(load_shown.group(2))["error"]
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    assert re.fullmatch(pattern, answer["error"]), (shown, answer["error"])


# -- dynamic_batching's delay: 0 when the file does not give one, as in Triton ---------------


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


DELAYS = {
    "empty": ("dynamic_batching {}\n", 0),  # Triton's default delay: 0
    "zero": ("dynamic_batching { max_queue_delay_microseconds: 0 }\n", 0),
    "none": ("", 0),  # no dynamic batcher: Triton runs each request as it comes
    "given": ("dynamic_batching { max_queue_delay_microseconds: 500 }\n", 500),
}


def test_a_pbtxt_without_a_delay_waits_for_no_more_requests(tmp_path: Path) -> None:
    """``dynamic_batching {}`` held every request up by the server's --max-delay-ms (2 ms; a
    config answer of 2000 us) where Triton runs it at once; the file's delay, 0 when not
    given, is the model's, and a load's inline config without one keeps it."""
    for name, (batching, _) in DELAYS.items():
        pbtxt = (
            'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
            'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n' + batching
        )
        triton_model(tmp_path, name, pbtxt, Double())
    config = test_config(
        device="cpu",
        model_repository=tmp_path,
        model_control_mode="explicit",
        load_models=("*",),
        max_delay_ms=50.0,  # a server default that a model without its own delay must not take
        grpc_port=0,
    )
    with ServerThread(config) as server:
        for name, (_, delay) in DELAYS.items():
            status, doc = call(server.port, "GET", f"/v2/models/{name}/config")
            assert status == 200, doc
            assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == delay, name
        body = orjson.dumps({"parameters": {"config": '{"max_batch_size": 2}'}})
        assert call(server.port, "POST", "/v2/repository/models/empty/load", body)[0] == 200
        status, doc = call(server.port, "GET", "/v2/models/empty/config")
        assert (doc["max_batch_size"], doc["dynamic_batching"]["max_queue_delay_microseconds"]) == (
            2,
            0,
        )


# -- an output declared of another kind than the model returns -------------------------------


class Scores(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5


def test_float_outputs_declared_as_integers_are_refused_not_cut(tmp_path: Path) -> None:
    """``data_type: TYPE_INT32`` for an output the model returns as floats: the server cast
    ``[0.5, 1.0, 1.5]`` to ``[0, 1, 1]`` and answered it; Triton's PyTorch backend refuses it
    (``configuration expects datatype TYPE_INT32 for output ..., model provides TYPE_FP32``),
    and so does the load's dry run here, naming both. A float output declared in another float
    precision, or an integer one in a wider type, is still cast (see Precision)."""
    for name, declared in (("cut", "TYPE_INT32"), ("flag", "TYPE_BOOL"), ("half", "TYPE_FP16")):
        pbtxt = (
            'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
            'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
            f'output [ {{ name: "OUTPUT__0" data_type: {declared} dims: [ 3 ] }} ]\n'
        )
        triton_model(tmp_path, name, pbtxt, Scores())
    with ServerThread(test_config(device="cpu", model_repository=tmp_path, grpc_port=0)) as server:
        _, index = call(server.port, "POST", "/v2/repository/index", b"{}")
        states = {entry["name"]: entry for entry in index}
        assert states["cut"]["state"] == "UNAVAILABLE"
        assert (
            "configuration expects datatype TYPE_INT32 for output 'OUTPUT__0', model provides "
            "TYPE_FP32" in states["cut"]["reason"]
        )
        assert states["flag"]["state"] == "UNAVAILABLE"
        assert "expects datatype TYPE_BOOL" in states["flag"]["reason"]
        assert states["half"]["state"] == "READY"
        body = {"inputs": [_tensor("INPUT__0", "FP32", [[1.0, 2.0, 3.0]])]}
        status, answer = call(server.port, "POST", "/v2/models/half/infer", orjson.dumps(body))
        assert status == 200, answer
        assert answer["outputs"][0]["datatype"] == "FP16"
        assert answer["outputs"][0]["data"] == [0.5, 1.0, 1.5]
