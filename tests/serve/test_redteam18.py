"""Round 18 of hostile clients: class ranks of large integers, every route in the OpenAPI
document, and a repeated bearer token over gRPC."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from torchplace.serve.classification import classify
from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, Running, test_config


@pytest.mark.parametrize(
    ("values", "dtype", "ranked"),
    [
        ([2**53, 2**53 + 1, 0], np.int64, [b"9007199254740993:1", b"9007199254740992:0"]),
        ([0, 2**64 - 1, 5], np.uint64, [b"18446744073709551615:1", b"5:2"]),
        ([-(2**63), 3, -1], np.int64, [b"3:1", b"-1:2"]),
    ],
)
def test_integers_are_ranked_in_their_own_type(
    values: list[int], dtype: type, ranked: list[bytes]
) -> None:
    # float64 cannot tell 2**53 from 2**53 + 1: Triton sorts in the tensor's own type
    found, shape = classify(np.array([values], dtype=dtype), "INT64", 2)
    assert found == ranked
    assert shape == [1, 2]


def test_the_openapi_document_lists_every_method_of_a_path(server: Running) -> None:
    status, _, body = server.client.get("/v2/openapi.json")
    assert status == 200
    paths = orjson.loads(body)["paths"]
    for path in ("/v2/trace/setting", "/v2/logging", "/v2/models/{MODEL_NAME}/trace/setting"):
        assert sorted(k for k in paths[path] if k != "parameters") == ["get", "post"], path
    for method in ("GET", "POST"):
        status, _, answer = server.client.request(
            method, "/v2/models/seed-mlp/trace/setting", body=b"{}" if method == "POST" else None
        )
        assert status == 200, answer


def test_a_repeated_authorization_header_is_refused_over_grpc(tmp_path: Path) -> None:
    # one token, as over HTTP (RFC 9110 5.3: Authorization is not a list): the last one no
    # longer wins
    grpc = pytest.importorskip("grpc")
    from torchplace.serve.proto import grpc_service_pb2 as pb

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with ServerThread(test_config(auth_token_file=token), engine=FakeEngine()) as server:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        try:
            metadata_call = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerMetadata",
                request_serializer=pb.ServerMetadataRequest.SerializeToString,
                response_deserializer=pb.ServerMetadataResponse.FromString,
            )
            good = [("authorization", "Bearer s3cret")]
            assert metadata_call(pb.ServerMetadataRequest(), metadata=good, timeout=10).name
            for pair in (["wrong", "s3cret"], ["s3cret", "s3cret"]):
                twice = [("authorization", f"Bearer {t}") for t in pair]
                with pytest.raises(grpc.RpcError) as caught:
                    metadata_call(pb.ServerMetadataRequest(), metadata=twice, timeout=10)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "repeated bearer token" in (caught.value.details() or "")
        finally:
            channel.close()
