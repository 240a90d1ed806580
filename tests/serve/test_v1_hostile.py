"""KServe V1 (``/v1/models/{name}:predict``) against a real server: hostile bodies get a clear
400 and the server keeps answering."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from torchplace.serve.running import ServerThread

from .conftest import Client, test_config

JSON = {"content-type": "application/json"}
ROW = [0.5] * 8


@pytest.fixture(scope="module")
def served() -> Iterator[ServerThread]:
    thread = ServerThread(test_config(model="seed-mlp", device="cpu", allow_nan=True)).start(
        timeout=120
    )
    try:
        yield thread
    finally:
        thread.stop()


def _predict(served: ServerThread, doc: object, path: str = "seed-mlp:predict") -> tuple[int, dict]:  # type: ignore[type-arg]
    status, _, data = Client("127.0.0.1", served.port).post(
        f"/v1/models/{path}", orjson.dumps(doc), headers=JSON
    )
    return status, orjson.loads(data)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"instances": [ROW], "inputs": [ROW]}, "both 'instances' and 'inputs'; send one"),
        ({"instances": [{"input": ROW, "inptu": ROW}]}, "names input 'inptu', which the model"),
    ],
)
def test_ambiguous_bodies_are_a_400_and_the_server_keeps_serving(
    served: ServerThread, doc: object, message: str
) -> None:
    status, answer = _predict(served, doc)
    assert status == 400
    assert message in answer["error"]
    status, answer = _predict(served, {"instances": [ROW]})
    assert status == 200
    assert len(answer["predictions"]) == 1


def test_nan_predictions_point_to_the_v2_route(served: ServerThread) -> None:
    """With --allow-nan a NaN in gives NaN out; the 400 told a V1 client to use binary_data,
    which V1 does not have."""
    status, answer = _predict(served, {"instances": [[None] * 8]})
    assert status == 400
    assert "/v2/models/seed-mlp/infer" in answer["error"]
    assert "V1 answers are JSON only" in answer["error"]


def test_an_unknown_verb_names_the_ones_served(served: ServerThread) -> None:
    status, answer = _predict(served, {"instances": [ROW]}, "seed-mlp:classify")
    assert status == 404
    assert "serves POST /v1/models/{name}:predict" in answer["error"]
