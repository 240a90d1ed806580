"""The official client, tritonclient.http, against a real `torchplace serve` (real engine).

JSON and binary tensors both ways, with and without a version, several rows, and the numbers
checked against the same model run in-process.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from torchplace.models import build_model
from torchplace.serve.running import ServerThread

from .conftest import test_config

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module", params=["seed-mlp", "wide-mlp"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    name = request.param
    thread = ServerThread(test_config(model=name, device="cpu")).start(timeout=120)
    try:
        yield name, f"127.0.0.1:{thread.port}"
    finally:
        thread.stop()


def reference(name: str, x: np.ndarray) -> np.ndarray:
    model = build_model(name)
    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("binary_in", [False, True], ids=["json-in", "binary-in"])
@pytest.mark.parametrize("binary_out", [False, True], ids=["json-out", "binary-out"])
@pytest.mark.parametrize("version", ["", "1"], ids=["no-version", "version"])
def test_infer_matches_the_model_in_process(
    served: tuple[str, str], binary_in: bool, binary_out: bool, version: str
) -> None:
    name, url = served
    client = httpclient.InferenceServerClient(url)
    try:
        meta = client.get_model_metadata(name)
        width = meta["inputs"][0]["shape"][1]
        x = np.random.default_rng(7).standard_normal((5, width)).astype(np.float32)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary_in)
        out = httpclient.InferRequestedOutput("output", binary_data=binary_out)
        result = client.infer(name, [inp], outputs=[out], model_version=version, request_id="r7")
        got = result.as_numpy("output")
        assert result.get_response()["id"] == "r7"
        assert got.dtype == np.float32
        assert got.shape == (5, meta["outputs"][0]["shape"][1])
        np.testing.assert_allclose(got, reference(name, x), rtol=1e-5, atol=1e-6)
    finally:
        client.close()


def test_health_metadata_and_default_binary_outputs(served: tuple[str, str]) -> None:
    name, url = served
    client = httpclient.InferenceServerClient(url)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready(name)
        assert client.is_model_ready(name, "1")
        assert not client.is_model_ready("no-such-model")
        server = client.get_server_metadata()
        assert "binary_tensor_data" in server["extensions"]
        assert client.get_model_config(name)["max_batch_size"] == 32
        width = client.get_model_metadata(name)["inputs"][0]["shape"][1]
        x = np.ones((1, width), np.float32)
        inp = httpclient.InferInput("input", [1, width], "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer(name, [inp])  # no outputs named: all come back binary
        assert "binary_data_size" in result.get_output("output")["parameters"]
        np.testing.assert_allclose(
            result.as_numpy("output"), reference(name, x), rtol=1e-5, atol=1e-6
        )
    finally:
        client.close()


def test_client_sees_clear_errors(served: tuple[str, str]) -> None:
    name, url = served
    client = httpclient.InferenceServerClient(url)
    try:
        width = client.get_model_metadata(name)["inputs"][0]["shape"][1]
        inp = httpclient.InferInput("input", [1, width + 1], "FP32")
        inp.set_data_from_numpy(np.zeros((1, width + 1), np.float32))
        with pytest.raises(InferenceServerException, match="unexpected shape for input"):
            client.infer(name, [inp])
        inp = httpclient.InferInput("input", [1, width], "FP64")
        inp.set_data_from_numpy(np.zeros((1, width), np.float64))
        with pytest.raises(InferenceServerException, match=f"but model '{name}' expects 'FP32'"):
            client.infer(name, [inp])
        inp = httpclient.InferInput("input", [1, width], "FP32")
        inp.set_data_from_numpy(np.zeros((1, width), np.float32))
        with pytest.raises(InferenceServerException, match=r"version .* is not found"):
            client.infer(name, [inp], model_version="9")
        with pytest.raises(InferenceServerException, match="Request for unknown model"):
            client.infer("other", [inp])
        assert client.is_server_ready()
    finally:
        client.close()


def test_compressed_request(served: tuple[str, str]) -> None:
    name, url = served
    client = httpclient.InferenceServerClient(url)
    try:
        width = client.get_model_metadata(name)["inputs"][0]["shape"][1]
        x = np.full((2, width), 0.25, np.float32)
        inp = httpclient.InferInput("input", [2, width], "FP32")
        inp.set_data_from_numpy(x)
        for algorithm in ("gzip", "deflate"):
            result = client.infer(name, [inp], request_compression_algorithm=algorithm)
            np.testing.assert_allclose(
                result.as_numpy("output"), reference(name, x), rtol=1e-5, atol=1e-6
            )
    finally:
        client.close()


@pytest.mark.cuda
def test_serves_on_cuda_with_binary_tensors() -> None:
    thread = ServerThread(test_config(model="wide-mlp", device="cuda:0")).start(timeout=300)
    try:
        assert thread.app is not None
        record = getattr(thread.app.engine, "startup_record", {})
        assert record.get("device") == "cuda:0"
        client = httpclient.InferenceServerClient(f"127.0.0.1:{thread.port}")
        try:
            x = np.random.default_rng(1).standard_normal((32, 512)).astype(np.float32)
            inp = httpclient.InferInput("input", [32, 512], "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            out = httpclient.InferRequestedOutput("output", binary_data=True)
            got = client.infer("wide-mlp", [inp], outputs=[out]).as_numpy("output")
            np.testing.assert_allclose(got, reference("wide-mlp", x), rtol=1e-3, atol=1e-4)
        finally:
            client.close()
    finally:
        thread.stop()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_a_request_of_1000_rows_is_answered_in_order(binary: bool) -> None:
    """1,000 rows at --max-batch-size 32: 32 chunks, two replicas, one answer, rows in order."""
    config = test_config(device="cpu", replicas_per_device=2, max_request_rows=1000)
    with ServerThread(config) as thread:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{thread.port}")
        try:
            x = np.random.default_rng(3).standard_normal((1000, 8)).astype(np.float32)
            x[:, 0] = np.arange(1000)  # each row says where it belongs
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = httpclient.InferRequestedOutput("output", binary_data=binary)
            got = client.infer("seed-mlp", [inp], outputs=[out]).as_numpy("output")
            assert got.shape == (1000, 2)
            np.testing.assert_allclose(got, reference("seed-mlp", x), rtol=1e-5, atol=1e-5)
            over = np.zeros((1001, 8), np.float32)
            big = httpclient.InferInput("input", list(over.shape), "FP32")
            big.set_data_from_numpy(over, binary_data=binary)
            with pytest.raises(InferenceServerException) as info:
                client.infer("seed-mlp", [big])
            assert info.value.status() == "413"
            assert "1001 rows is over the limit of 1000" in info.value.message()
        finally:
            client.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_answers(served: tuple[str, str], algorithm: str) -> None:
    name, url = served
    client = httpclient.InferenceServerClient(url)
    try:
        width = client.get_model_metadata(name)["inputs"][0]["shape"][1]
        x = np.random.default_rng(3).standard_normal((3, width)).astype(np.float32)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = client.infer(
            name,
            [inp],
            outputs=[httpclient.InferRequestedOutput("output", binary_data=True)],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_allclose(
            result.as_numpy("output"), reference(name, x), rtol=1e-5, atol=1e-6
        )
    finally:
        client.close()
