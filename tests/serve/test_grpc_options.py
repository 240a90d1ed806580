"""--grpc-port and --name: defaults, the missing extra, a port in use, the served name."""

from __future__ import annotations

import importlib.util
import socket
from typing import Any

import pytest

from torchplace.cli import main
from torchplace.errors import ConfigError
from torchplace.serve.config import ServeConfig
from torchplace.serve.running import GRPC_PORT, ServerThread, grpc_port

from .conftest import FakeEngine, test_config

pytest.importorskip("grpc")


def test_grpc_port_defaults_to_tritons_and_follows_port_zero() -> None:
    assert grpc_port(ServeConfig()) == GRPC_PORT == 8001
    assert grpc_port(ServeConfig(port=0)) == 0  # tests and benchmarks: any free port
    assert grpc_port(ServeConfig(grpc_port=0)) is None
    assert grpc_port(ServeConfig(grpc_port=9001)) == 9001
    with pytest.raises(ConfigError, match=r"grpc_port=70000 is invalid"):
        ServeConfig(grpc_port=70000)


def _without_grpc(monkeypatch: pytest.MonkeyPatch, missing: str = "grpc") -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == missing else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("missing", ["grpc", "hpack"])  # grpcio, or the transport's HPACK
def test_without_the_extra_grpc_is_off_unless_asked_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    _without_grpc(monkeypatch, missing)
    assert grpc_port(ServeConfig()) is None
    assert main(["serve", "--port", "0", "--grpc-port", "8001"]) == 2  # before the model loads
    err = capsys.readouterr().err
    assert "--grpc-port 8001 needs the grpc extra" in err
    assert "pip install 'torchplace[grpc]'" in err


def test_a_grpc_port_in_use_is_a_config_error_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        thread = ServerThread(test_config(grpc_port=port), engine=FakeEngine())
        with pytest.raises(
            ConfigError, match=rf"cannot listen for gRPC on 127.0.0.1:{port}.*--grpc-port"
        ):
            thread.start(timeout=30)
        thread.stop()


def test_grpc_off_serves_rest_alone() -> None:
    with ServerThread(test_config(grpc_port=0), engine=FakeEngine()) as server:
        assert server.grpc_port is None
        assert server.port > 0
