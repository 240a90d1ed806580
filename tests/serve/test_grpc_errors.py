"""Every serving error reaches a tritonclient.grpc caller as its gRPC status, same message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from torchplace.errors import (
    DeviceOutOfMemoryError,
    KernelError,
    NotReadyError,
    OverloadedError,
    ServeError,
)
from torchplace.serve.admission import DeadlineExceededError
from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, test_config

grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402


def _input() -> object:
    inp = grpcclient.InferInput("input", [1, 8], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 8), np.float32))
    return inp


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (OverloadedError("over capacity; retry shortly"), "RESOURCE_EXHAUSTED"),
        (NotReadyError("no healthy replica"), "UNAVAILABLE"),
        (DeadlineExceededError("the request's deadline passed"), "DEADLINE_EXCEEDED"),
        (DeviceOutOfMemoryError("one row does not fit"), "RESOURCE_EXHAUSTED"),
        (KernelError("forward raised"), "INTERNAL"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, ServeError) else v,
)
def test_serving_errors_map_to_grpc_status_codes(error: ServeError, code: str) -> None:
    with ServerThread(test_config(), engine=FakeEngine(fail_with=error)) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            with pytest.raises(InferenceServerException) as caught:
                client.infer("seed-mlp", [_input()])
        finally:
            client.close()
    assert str(caught.value.status()) == f"StatusCode.{code}"
    assert caught.value.message() == str(error)


def test_a_bearer_token_guards_every_call_but_the_health_probes(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = test_config(auth_token_file=token)
    with ServerThread(config, engine=FakeEngine()) as server:
        url = f"127.0.0.1:{server.grpc_port}"
        client = grpcclient.InferenceServerClient(url)
        try:
            assert client.is_server_live()
            assert client.is_server_ready()
            with pytest.raises(InferenceServerException) as caught:
                client.infer("seed-mlp", [_input()])
            assert str(caught.value.status()) == "StatusCode.UNAUTHENTICATED"
            assert "missing bearer token" in caught.value.message()
            good = {"authorization": "Bearer s3cret"}
            result = client.infer("seed-mlp", [_input()], headers=good)
            assert result.as_numpy("output").shape == (1, 2)
            with pytest.raises(InferenceServerException, match="wrong bearer token"):
                client.get_model_metadata("seed-mlp", headers={"authorization": "Bearer no"})
        finally:
            client.close()
