"""A sixth red-team pass: trace-context headers that made the server log a line per request,
and version directory names that ``str.isdigit`` takes but ``int`` does not read as written.

Each test states what a client (or a repository) sent and what the server must answer;
afterwards the shared server still answers a normal inference correctly.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from torchplace.errors import ConfigError
from torchplace.serve.app import _caller
from torchplace.serve.registry import _version_key
from torchplace.serve.repository import read_model
from torchplace.serve.running import ServerThread
from torchplace.serve.triton import _version_number

from .conftest import answer_of, raw_request, seed_input
from .repository_helpers import explicit_repository, infer_body, write_model

_GOOD = orjson.dumps({"inputs": [seed_input()]})
_PARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


pytestmark = pytest.mark.usefixtures("still_serving")


# -- trace context: a client must not be able to write the server's log ----------------------
_LONG_PARENT = b"00-" + b"a" * 600 + b"-01"  # over OpenTelemetry's 512 characters
_BAD_STATES = [b"A=1", b"a=" + b"x" * 9000]  # a key in upper case; over 8,192 characters


def _trace_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]


@pytest.mark.parametrize(
    "headers",
    [
        {b"traceparent": _LONG_PARENT},
        *({b"traceparent": _PARENT, b"tracestate": state} for state in _BAD_STATES),
    ],
    ids=["long-traceparent", "uppercase-tracestate", "long-tracestate"],
)
def test_a_trace_header_the_propagator_drops_writes_no_log_line(
    hostile_server: ServerThread, caplog: pytest.LogCaptureFixture, headers: dict[bytes, bytes]
) -> None:
    """OpenTelemetry's W3C propagator logs a WARNING for each traceparent over 512 characters
    and each tracestate it drops (a member not in the W3C format, quoted whole; over 8,192
    characters): every such request wrote a line to the server's log, so a client could fill
    it at the rate it sends requests. The header is still dropped; nothing is logged."""
    pytest.importorskip("opentelemetry.trace")
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        status, body = answer_of(hostile_server.port, raw_request(_GOOD, headers=headers))
        assert status == 200, body
    assert _trace_warnings(caplog) == []


def test_a_dropped_tracestate_still_joins_the_caller_s_trace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("opentelemetry.trace")
    from opentelemetry import trace
    from opentelemetry.trace.span import TraceState

    caplog.set_level(logging.WARNING)
    for state in _BAD_STATES:
        context: Any = _caller({b"traceparent": _PARENT, b"tracestate": state})
        span = trace.get_current_span(context).get_span_context()
        assert span.is_valid  # the parent is kept; only its state is dropped
        assert format(span.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
        assert len(span.trace_state) == 0
    assert _caller({b"traceparent": _LONG_PARENT}) is None
    assert _trace_warnings(caplog) == []
    TraceState.from_header(["A=1"])  # outside a request's headers, OpenTelemetry still warns
    assert len(_trace_warnings(caplog)) == 1


# -- version directories: ASCII digits, written as the number ---------------------------------
def test_a_version_directory_of_other_digits_is_not_a_version(tmp_path: Path) -> None:
    """'²' is a digit to ``str.isdigit`` and not to ``int``: a model directory holding one
    failed to load with a ValueError (a 500, 'internal server error'). It is not a version
    directory, as a name that is not a number is not one."""
    write_model(tmp_path, "m")
    for name in ("²", "١", "٣"):
        (tmp_path / "m" / name).mkdir()
    assert read_model(tmp_path, "m").versions == ("1",)


def test_a_version_directory_with_a_leading_zero_is_refused_naming_the_fix(
    tmp_path: Path,
) -> None:
    """'007' was read as version 7, then loaded from the directory '7', which does not exist:
    a FileNotFoundError, answered 500."""
    write_model(tmp_path, "m")
    (tmp_path / "m" / "007").mkdir()
    with pytest.raises(ConfigError, match=r"version directory '007' is not written as a version "
                       r"number .*rename it '7'"):  # fmt: skip
        read_model(tmp_path, "m")


def test_odd_version_directories_over_rest_are_a_clear_answer(tmp_path: Path) -> None:
    config = explicit_repository(tmp_path)
    write_model(tmp_path, "odd")
    (tmp_path / "odd" / "²").mkdir()
    write_model(tmp_path, "padded", weights=False)
    (tmp_path / "padded" / "1").rmdir()
    (tmp_path / "padded" / "01").mkdir()
    with ServerThread(config) as thread:
        load = b"/v2/repository/models/%s/load"
        status, body = answer_of(thread.port, raw_request(b"", path=load % b"odd"))
        assert status == 200, body
        status, body = answer_of(
            thread.port, raw_request(orjson.dumps(infer_body()), path=b"/v2/models/odd/infer")
        )
        assert status == 200, body
        status, body = answer_of(thread.port, raw_request(b"", path=load % b"padded"))
        assert status == 400, body
        assert b"version directory '01'" in body
        assert b"rename it '1'" in body
        status, body = answer_of(
            thread.port, raw_request(orjson.dumps(infer_body()), path=b"/v2/models/a/infer")
        )
        assert status == 200, body  # the others still served


def test_a_version_of_other_digits_is_ordered_and_listed_without_int_failing() -> None:
    """``--model-version ²`` (any text is a version) made int() fail where versions are
    ordered (publish) and where ModelConfig lists them."""
    assert _version_key("²") == (0, "²")
    assert _version_key("12") == (1, 12)
    assert _version_number("²") == 0
    assert _version_number("3") == 3
