"""Triton's classification extension: an output answered as its top classes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.errors import ConfigError, InputError
from torchplace.models import TensorSpec
from torchplace.serve import protocol
from torchplace.serve.classification import classify, serialize_bytes
from torchplace.serve.loader import load_model
from torchplace.serve.repository import read_model
from torchplace.serve.running import ServerThread

from .classifier_model import LABELS
from .conftest import test_config

MODEL = "tests.serve.classifier_model:build"


def test_each_row_s_top_classes_best_first() -> None:
    scores = np.array([[0.1, 0.7, 0.2, 0.7], [4.0, 3.0, 2.0, 1.0]], np.float32)
    items, shape = classify(scores, "FP32", 3, LABELS)
    assert shape == [2, 3]
    assert items == [b"0.700000:1:dog", b"0.700000:3:fish", b"0.200000:2:bird",  # ties: lower first
                     b"4.000000:0:cat", b"3.000000:1:dog", b"2.000000:2:bird"]  # fmt: skip


def test_integers_few_columns_and_missing_labels() -> None:
    items, shape = classify(np.array([[3, 9]], np.int64), "INT64", 5, ["only-one"])
    assert shape == [1, 2]  # no more classes than values
    assert items == [b"9:1", b"3:0:only-one"]


def test_bytes_are_serialized_as_triton_does() -> None:
    assert serialize_bytes([b"ab", b""]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


OUT = (TensorSpec("output", "FP32", (-1, 4)), TensorSpec("mask", "BOOL", (-1, 4)))


def _decode(outputs: list[dict[str, Any]]) -> protocol.InferRequest:
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}],
           "outputs": outputs}  # fmt: skip
    return protocol.decode_infer_request(
        orjson.dumps(doc), inputs=(TensorSpec("input", "FP32", (-1, 4)),), outputs=OUT, max_rows=8
    )


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"classification": -1}, "must be a positive integer"),
        ({"classification": "3"}, "must be a positive integer"),
        ({"classification": 1.5}, "must be a positive integer"),
        ({"classification": 2, "shared_memory_region": "r", "shared_memory_byte_size": 8},
         "'classification' and 'shared_memory_region' both set"),
    ],
)  # fmt: skip
def test_a_bad_classification_parameter_is_refused(
    parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        _decode([{"name": "output", "parameters": parameters}])


def test_classification_zero_asks_for_values_and_bool_has_no_classes() -> None:
    assert _decode([{"name": "output", "parameters": {"classification": 0}}]).outputs == (
        protocol.RequestedOutput("output", False),
    )
    with pytest.raises(
        InputError, match="class result not available for output due to unsupported type 'BOOL'"
    ):
        _decode([{"name": "mask", "parameters": {"classification": 1}}])


def test_labels_are_checked_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.serve import classifier_model

    original = classifier_model.build

    def labelled(labels: object) -> Any:
        def build() -> Any:
            model = original()
            model.torchplace_labels = labels
            return model

        return build

    for labels, message in (({"nope": ["a"]}, "names \\['nope'\\], not outputs"),
                            ([1, 2], "must be a sequence of class names")):  # fmt: skip
        monkeypatch.setattr(classifier_model, "build", labelled(labels))
        with pytest.raises(ConfigError, match=message):
            load_model(MODEL)
    monkeypatch.setattr(classifier_model, "build", labelled({"output": ["x", "y"]}))
    assert load_model(MODEL).labels == {"output": ("x", "y")}


def test_a_labels_file_names_every_output_s_classes(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("no\nyes\n")
    assert load_model(MODEL, labels=labels).labels == {"output": ("no", "yes")}  # over the module's
    with pytest.raises(ConfigError, match=r"cannot read the labels file .*one class name per line"):
        load_model(MODEL, labels=tmp_path / "missing.txt")


def test_a_repository_model_names_its_labels_file(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.toml").write_text('source = "seed-mlp"\nlabels = "labels.txt"\n')
    model = read_model(tmp_path, "m")
    assert model.version_settings("1")["labels"] == str(tmp_path / "m" / "labels.txt")
    (tmp_path / "m" / "config.toml").write_text('source = "seed-mlp"\nlabels = "a/b.txt"\n')
    with pytest.raises(ConfigError, match=r"'labels' = 'a/b\.txt' is not a file name"):
        read_model(tmp_path, "m")


httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(test_config(model=MODEL, name="animals", device="cpu")) as thread:
        yield thread


@pytest.mark.parametrize("how", ["http-binary", "http-json", "grpc"])
def test_tritonclient_class_count_gets_the_top_classes(server: ServerThread, how: str) -> None:
    """What Triton's image_client.py asks for (class_count) and parses (value:index:label)."""
    grpc = how == "grpc"
    mod = grpcclient if grpc else httpclient
    client = mod.InferenceServerClient(f"127.0.0.1:{server.grpc_port if grpc else server.port}")
    x = np.array([[0.1, 0.9, 0.3, 0.2], [0.5, 0.0, 0.0, 0.8]], np.float32)
    inp = mod.InferInput("input", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    extra = {} if grpc else {"binary_data": how == "http-binary"}
    out = mod.InferRequestedOutput("output", class_count=2, **extra)
    result = client.infer("animals", [inp], outputs=[out])
    got = result.as_numpy("output")
    assert got.shape == (2, 2)
    texts = [[v.decode() if isinstance(v, bytes) else v for v in row] for row in got]
    assert texts == [["0.900000:1:dog", "0.300000:2:bird"], ["0.800000:3:fish", "0.500000:0:cat"]]
    client.close()


def test_labels_given_by_file_to_the_server(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("low\nhigh\n")
    config = test_config(model="seed-mlp", device="cpu", labels=labels, grpc_port=0)
    with ServerThread(config) as thread:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{thread.port}")
        inp = httpclient.InferInput("input", [1, 8], "FP32")
        inp.set_data_from_numpy(np.ones((1, 8), np.float32))
        out = httpclient.InferRequestedOutput("output", binary_data=False, class_count=2)
        got = client.infer("seed-mlp", [inp], outputs=[out]).as_numpy("output")
        assert sorted(v.split(":")[2] for v in got[0]) == ["high", "low"]
        client.close()
