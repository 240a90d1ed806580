"""Triton's logging extension: ``/v2/logging`` and gRPC ``LogSettings``
(:mod:`torchplace.serve.log_settings`)."""

from __future__ import annotations

import http.client
import logging
import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from torchplace.errors import InputError, UnsupportedSettingError
from torchplace.serve.log_settings import SETTINGS, LogSettings
from torchplace.serve.running import ServerThread

from .conftest import test_config


class _Lines(logging.Handler):
    """The lines written, through the handler's own formatter."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def lines() -> Iterator[_Lines]:
    """A handler on the ``torchplace`` logger (at INFO, not propagating), taken off after."""
    logger = logging.getLogger("torchplace")
    handler, level, propagate = _Lines(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def _log_each_level() -> None:
    log = logging.getLogger("torchplace.serve.somewhere")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")


def test_the_settings_are_read_from_the_logger_until_changed(lines: _Lines) -> None:
    settings = LogSettings()
    assert settings.document() == {
        "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
        "log_verbose_level": 0, "log_format": "default",
    }  # fmt: skip
    logging.getLogger("torchplace").setLevel(logging.ERROR)
    got = settings.document()
    assert (got["log_info"], got["log_warning"], got["log_error"]) == (False, False, True)
    assert list(got) == list(SETTINGS)


def test_each_level_switches_on_its_own_and_close_puts_everything_back(lines: _Lines) -> None:
    settings = LogSettings()
    got = settings.update({"log_warning": False, "log_verbose_level": 2})
    assert (got["log_warning"], got["log_verbose_level"], got["log_info"]) == (False, 2, True)
    _log_each_level()
    assert lines.lines == ["DEBUG d", "INFO i", "ERROR e"]  # warnings off, errors still on
    settings.update({"log_info": False, "log_error": False, "log_verbose_level": 0})
    lines.lines.clear()
    _log_each_level()
    assert lines.lines == []
    settings.close()
    _log_each_level()
    assert lines.lines == ["INFO i", "WARNING w", "ERROR e"]  # as before any change
    assert logging.getLogger("torchplace").level == logging.INFO
    assert settings not in lines.filters


def test_other_loggers_records_are_left_alone(lines: _Lines) -> None:
    other = logging.getLogger("elsewhere")
    other.addHandler(lines)
    other.propagate = False
    settings = LogSettings()
    try:
        settings.update({"log_warning": False})
        other.warning("theirs")
        logging.getLogger("torchplace.x").warning("ours")
        assert lines.lines == ["WARNING theirs"]
    finally:
        settings.close()
        other.removeHandler(lines)


def test_iso8601_puts_the_utc_time_first_and_default_takes_it_off(lines: _Lines) -> None:
    settings = LogSettings()
    try:
        assert settings.update({"log_format": "ISO8601"})["log_format"] == "ISO8601"
        logging.getLogger("torchplace.x").info("hello")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO hello", lines.lines[-1])
        settings.update({"log_format": "default"})
        logging.getLogger("torchplace.x").info("again")
        assert lines.lines[-1] == "INFO again"
    finally:
        settings.close()
    assert type(lines.formatter) is logging.Formatter  # its own again


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"log_info": 1}, InputError, "expect boolean for 'log_info', got 1"),
        ({"log_error": "false"}, InputError, "expect boolean for 'log_error'"),
        ({"log_verbose_level": -1}, InputError, "integer from 0 to 2147483647 for 'log_verb"),
        ({"log_verbose_level": 2**40}, InputError, "'log_verbose_level', got 1099511627776"),
        ({"log_verbose_level": True}, InputError, "'log_verbose_level', got True"),
        ({"log_format": "json"}, InputError, "invalid argument for log_format, got: 'json'"),
        ({"log_file": "/tmp/x.log"}, UnsupportedSettingError, "can not be updated through"),
        ({"log_levels": True}, InputError, "unknown log setting 'log_levels'; the settings are"),
    ],
)
def test_a_bad_setting_changes_nothing(
    lines: _Lines, changes: dict[str, Any], error: type[Exception], words: str
) -> None:
    """Checked whole first: the good setting before the bad one is not applied either."""
    settings = LogSettings()
    with pytest.raises(error, match=re.escape(words)):
        settings.update({"log_info": False, **changes})
    assert settings.document()["log_info"] is True
    assert logging.getLogger("torchplace").level == logging.INFO


def test_a_null_value_leaves_the_setting_as_it_is(lines: _Lines) -> None:
    settings = LogSettings()
    try:
        assert settings.update({"log_info": None, "log_file": None})["log_info"] is True
    finally:
        settings.close()


# -- over the wire ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    pytest.importorskip("grpc")
    thread = ServerThread(test_config(model="seed-mlp", device="cpu"))
    thread.start(timeout=120)
    try:
        yield thread
    finally:
        thread.stop()


def _request(port: int, method: str, body: bytes | None = None) -> tuple[int, Any, str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, "/v2/logging", body=body)
        response = conn.getresponse()
        data = response.read()
        return response.status, orjson.loads(data) if data else None, response.getheader("allow")
    finally:
        conn.close()


def test_rest_reads_changes_and_refuses_as_triton_does(server: ServerThread) -> None:
    status, metadata, _ = _request(server.port, "GET")
    assert status == 200
    assert list(metadata) == list(SETTINGS)
    status, changed, _ = _request(server.port, "POST", b'{"log_warning": false}')
    assert status == 200
    assert changed["log_warning"] is False
    assert _request(server.port, "GET")[1] == changed
    status, error, _ = _request(server.port, "POST", b'{"log_file": "x.log"}')
    assert status == 501
    assert "log file location can not be updated" in error["error"]
    status, error, _ = _request(server.port, "POST", b'{"log_info": "yes"}')
    assert status == 400
    assert "expect boolean for 'log_info'" in error["error"]
    status, error, _ = _request(server.port, "POST", b"[1]")
    assert status == 400
    assert "JSON object" in error["error"]
    status, error, allow = _request(server.port, "PUT", b"{}")
    assert (status, allow) == (405, "GET, HEAD, POST"), error
    assert _request(server.port, "POST", b"")[0] == 200  # no body: a read, as in Triton
    assert _request(server.port, "POST", b'{"log_warning": true}')[1]["log_warning"] is True


def test_tritonclient_over_both_protocols(server: ServerThread) -> None:
    http_client = pytest.importorskip("tritonclient.http")
    grpc_client = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    metadata = http_client.InferenceServerClient(f"127.0.0.1:{server.port}").get_server_metadata()
    assert "logging" in metadata["extensions"]
    client = grpc_client.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        changed = client.update_log_settings({"log_error": False}, as_json=True)["settings"]
        assert changed["log_error"] == {"bool_param": False}
        assert changed["log_verbose_level"] == {"uint32_param": 0}
        assert client.get_log_settings(as_json=True)["settings"]["log_format"] == {
            "string_param": "default"
        }
        with pytest.raises(InferenceServerException) as caught:
            client.update_log_settings({"log_file": "/tmp/x.log"})
        assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
        with pytest.raises(InferenceServerException) as caught:
            client.update_log_settings({"log_format": "json"})
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "got: 'json'" in caught.value.message()
        client.update_log_settings({"log_error": True})
    finally:
        client.close()
