"""docs/serve.md: its Python examples run (against a server on a free port)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchplace.serve.running import ServerThread

from .conftest import test_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_python_examples_of_docs_serve_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tritonclient.http")
    monkeypatch.chdir(tmp_path)  # the examples write files (model.pt2)
    blocks = _blocks()
    assert len(blocks) >= 2, "docs/serve.md lost its python examples"
    # the shared-memory example needs --allow-client-shm
    with ServerThread(test_config(device="cpu", allow_client_shm=True)) as server:
        for block in blocks:
            code = block.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")
            if "127.0.0.1:8001" in code:  # the gRPC example
                pytest.importorskip("tritonclient.grpc")
                assert server.grpc_port is not None, "the test server serves no gRPC"
                code = code.replace("127.0.0.1:8001", f"127.0.0.1:{server.grpc_port}")
            namespace: dict[str, object] = {}
            exec(compile(code, str(DOC), "exec"), namespace)
            if "y" in namespace:
                assert getattr(namespace["y"], "shape", None) == (1000, 2)
