"""A fifth red-team pass over REST: encoded slashes in the path, Host values, and what the
messages of a few refusals say (an empty V1 body, integers past 64 bits, an inline config's
huge integers and lone surrogate escapes).

Each test states what a client sent and what the server must answer; afterwards the shared
server still answers a normal inference correctly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from torchplace.errors import ConfigError, InputError
from torchplace.models import TensorSpec
from torchplace.serve.protocol import decode_infer_request
from torchplace.serve.repository import triton_settings
from torchplace.serve.running import ServerThread

from .conftest import StartServer, answer_of, raw_request, seed_input
from .repository_helpers import explicit_repository, infer_body

_GOOD = orjson.dumps({"inputs": [seed_input()]})


pytestmark = pytest.mark.usefixtures("still_serving")


@pytest.fixture
def repository_server(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(explicit_repository(tmp_path)) as thread:
        yield thread


# -- an encoded slash is part of a segment (RFC 3986, 2.2) -----------------------------------
@pytest.mark.parametrize(
    "path",
    [b"/v2%2Frepository/models/b/unload", b"/v2/repository%2Fmodels%2Fb%2Funload"],
)
def test_an_encoded_slash_does_not_reach_the_repository_routes(
    repository_server: ServerThread, path: bytes
) -> None:
    """The whole path was percent-decoded before it was split, so ``%2F`` became a separator:
    ``/v2%2Frepository/models/b/unload`` unloaded model b. URIs that differ by a reserved
    character and its percent-encoding are not equivalent (RFC 3986, 2.2), and a proxy that
    guards ``/v2/repository/`` by prefix lets that path through."""
    status, body = answer_of(repository_server.port, raw_request(b"{}", path=path))
    assert status == 404, body
    assert b"no route" in body
    status, body = answer_of(
        repository_server.port,
        raw_request(orjson.dumps(infer_body()), path=b"/v2/models/b/infer"),
    )
    assert status == 200, body  # b is still loaded


def test_an_encoded_slash_in_a_model_name_is_part_of_the_name(
    hostile_server: ServerThread,
) -> None:
    path = b"/v2/models/seed-mlp%2Finfer"
    status, body = answer_of(hostile_server.port, raw_request(_GOOD, path=path))
    assert status == 404, body
    assert b"'seed-mlp/infer' is not found" in body
    for encoded in (b"/v2/models/seed%2Dmlp/infer", b"/v2/models/seed-mlp/%69nfer/"):
        status, body = answer_of(hostile_server.port, raw_request(_GOOD, path=encoded))
        assert status == 200, body  # other encoded characters still mean themselves


# -- Host values (RFC 9112, 3.2: a server MUST answer 400 to an invalid one) -----------------
@pytest.mark.parametrize("host", [b"a b", b"caf\xe9", b"localhost:port", b"[::1", b"a/b"])
def test_a_host_header_with_an_invalid_value_is_400(
    hostile_server: ServerThread, host: bytes
) -> None:
    payload = raw_request(b"", method=b"GET", path=b"/v2/health/ready", headers={b"Host": host})
    status, body = answer_of(hostile_server.port, payload)
    assert status == 400, body
    assert b"is not a valid host and optional port" in body


@pytest.mark.parametrize("host", [b"localhost", b"127.0.0.1:8000", b"[::1]:8000", b"", b"a_b."])
def test_a_valid_host_header_is_served(hostile_server: ServerThread, host: bytes) -> None:
    payload = raw_request(b"", method=b"GET", path=b"/v2/health/ready", headers={b"Host": host})
    assert answer_of(hostile_server.port, payload)[0] == 200


# -- the health probes are public with a trailing slash too ----------------------------------
def test_a_health_probe_with_a_trailing_slash_needs_no_token(
    start_server: StartServer, tmp_path: Path
) -> None:
    """With --auth-token-file, ``/v2/health/ready/`` was 401 (the token was asked for before the
    trailing slash was dropped), though the same route answers 200 without a token: a probe
    configured with the slash failed only once auth was turned on."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    running = start_server(auth_token_file=token)
    for path in ("/v2/health/ready/", "/v2/health/live//"):
        assert running.client.get(path)[0] == 200, path
    for path in ("/v2/models/", "/v2/models/seed-mlp/", "/metrics/"):
        assert running.client.get(path)[0] == 401, path


# -- what refusals say -------------------------------------------------------------------------
def test_an_empty_v1_body_is_told_to_send_a_v1_request(hostile_server: ServerThread) -> None:
    """It was told to send "an OIP inference request object", which V1 is not."""
    payload = raw_request(b"", path=b"/v1/models/seed-mlp:predict")
    status, body = answer_of(hostile_server.port, payload)
    assert status == 400, body
    assert b'{\\"instances\\": [...]}' in body
    assert b"OIP" not in body


@pytest.mark.parametrize(
    ("datatype", "value", "said"),
    [
        ("UINT64", "18446744073709551616", "value 18446744073709551616 is out of range for UINT64"),
        ("INT64", "9223372036854775808", "value 9223372036854775808 is out of range for INT64"),
        ("INT64", "-100000000000000000000", "value -100000000000000000000 is out of range"),
    ],
)
def test_an_integer_past_64_bits_is_told_out_of_range(datatype: str, value: str, said: str) -> None:
    """An integer past 64 bits (parsed as a float) was refused as "'data' holds non-integer
    numbers", and one in uint64's range for INT64 as "a value is out of range", naming no
    value and no range."""
    body = b'{"inputs":[{"name":"x","datatype":"%s","shape":[1,3],"data":[%s,1,2]}]}' % (
        datatype.encode(),
        value.encode(),
    )
    with pytest.raises(InputError, match=said):
        decode_infer_request(
            body,
            inputs=(TensorSpec("x", datatype, (-1, 3)),),
            outputs=(TensorSpec("y", "FP32", (-1, 3)),),
            max_rows=8,
        )


def test_an_inline_config_s_huge_integer_is_told_without_python_s_advice() -> None:
    """It was told "use sys.set_int_max_str_digits() to increase the limit": advice for the
    server's code, not for the client."""
    with pytest.raises(ConfigError, match="an integer thousands of digits long") as err:
        triton_settings('{"max_batch_size": 1' + "0" * 5000 + "}")
    assert "sys." not in str(err.value)


@pytest.mark.parametrize(
    "config",
    [
        '{"labels": "\\udc00"}',
        '{"input": [{"name": "\\ud800", "data_type": "TYPE_FP32", "dims": [8]}]}',
    ],
    ids=["labels", "input name"],
)
def test_an_inline_config_with_a_lone_surrogate_escape_is_refused_as_it_is_read(
    config: str,
) -> None:
    with pytest.raises(ConfigError, match=r"lone surrogate escape \(\\ud[8c]00"):
        triton_settings(config)


def test_a_load_with_a_lone_surrogate_in_its_config_is_told_so(
    repository_server: ServerThread,
) -> None:
    """The load failed deep inside with "TypeError: str is not valid UTF-8: surrogates not
    allowed" (or a UnicodeEncodeError), a codec's words for the client's config."""
    config = '{"input": [{"name": "\\udc00", "data_type": "TYPE_FP32", "dims": [8]}]}'
    body = orjson.dumps({"parameters": {"config": config}})
    status, answer = answer_of(
        repository_server.port, raw_request(body, path=b"/v2/repository/models/b/load")
    )
    assert status == 400, answer
    assert b"lone surrogate escape" in answer
    assert b"Error" not in answer
