"""System shared memory: the region registry, the codecs' use of it, and Triton's own clients.

The registry is tested on files in a temporary directory standing in for ``/dev/shm``; the
end-to-end tests create real POSIX shared memory with ``tritonclient.utils.shared_memory``
and run the client code of Triton's shared-memory examples against a real server.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.errors import (
    InputError,
    SharedMemoryDisabledError,
    SharedMemoryError,
    SharedMemoryNotFoundError,
)
from torchplace.models import TensorSpec
from torchplace.serve import protocol
from torchplace.serve import shm as shm_module
from torchplace.serve.running import ServerThread
from torchplace.serve.shm import SharedMemoryRegions

from .conftest import test_config

IN = (TensorSpec("INPUT0", "INT32", (-1, 16)), TensorSpec("INPUT1", "INT32", (-1, 16)))
OUT = (TensorSpec("OUTPUT0", "INT32", (-1, 16)), TensorSpec("OUTPUT1", "INT32", (-1, 16)))


@pytest.fixture
def regions(tmp_path: Path) -> SharedMemoryRegions:
    (tmp_path / "obj").write_bytes(bytes(256))
    return SharedMemoryRegions(allowed=True, root=tmp_path)


# -- the registry ---------------------------------------------------------------------------
def test_register_status_unregister(regions: SharedMemoryRegions) -> None:
    regions.register("a", "/obj", 0, 128)
    regions.register("b", "obj", 128, 128)  # leading slashes are optional, as for shm_open
    assert regions.status() == [
        {"name": "a", "key": "/obj", "offset": 0, "byte_size": 128},
        {"name": "b", "key": "obj", "offset": 128, "byte_size": 128},
    ]
    assert regions.status("b") == [regions.status()[1]]
    regions.unregister("a")
    regions.unregister("never-registered")  # no error, as in Triton
    assert [r["name"] for r in regions.status()] == ["b"]
    regions.unregister()
    assert regions.status() == []
    with pytest.raises(SharedMemoryNotFoundError, match=r"Unable to find .* 'b'"):
        regions.status("b")


def test_a_region_in_use_is_unregistered_when_its_last_user_is_answered(
    regions: SharedMemoryRegions,
) -> None:
    regions.register("a", "/obj", 0, 8)
    regions.register("b", "/obj", 8, 8)
    with regions.recording() as used:
        regions.target("a", 0, 8, "input 'x'").read()
        regions.target("a", 0, 4, "output 'y'")
    first = regions.hold(used)
    second = regions.hold(used)
    regions.unregister()  # 'b' goes at once; 'a' stays, listed and usable, while in use
    assert [r["name"] for r in regions.status()] == ["a"]
    assert len(regions.target("a", 0, 8, "input 'x'").read()) == 8
    with pytest.raises(SharedMemoryError, match="already in manager"):
        regions.register("a", "/obj", 0, 8)
    regions.release(first)
    assert [r["name"] for r in regions.status()] == ["a"]
    regions.release(second)
    assert regions.status() == []
    regions.register("a", "/obj", 0, 8)  # the name is free again


def test_reads_and_writes_reach_the_object(regions: SharedMemoryRegions, tmp_path: Path) -> None:
    regions.register("r", "/obj", 64, 64)
    regions.target("r", 8, 4, "output 'y'").write(b"abcd")
    assert (tmp_path / "obj").read_bytes()[72:76] == b"abcd"
    assert regions.target("r", 8, 4, "input 'x'").read() == b"abcd"


def test_a_truncated_object_is_an_error_not_a_crash(
    regions: SharedMemoryRegions, tmp_path: Path
) -> None:
    """The object shrinks under the server (a mapping would die with SIGBUS)."""
    regions.register("r", "/obj", 0, 256)
    os.truncate(tmp_path / "obj", 16)
    with pytest.raises(SharedMemoryError, match=r"now ends before byte 32 .*register it again"):
        regions.target("r", 0, 32, "input 'x'").read()
    regions.target("r", 0, 32, "output 'y'").write(bytes(32))  # grows it back, harmlessly


def test_descriptors_are_closed_and_counted(
    regions: SharedMemoryRegions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = len(os.listdir("/proc/self/fd"))
    regions.register("a", "/obj", 0, 8)
    assert len(os.listdir("/proc/self/fd")) == opened + 1
    regions.unregister("a")
    assert len(os.listdir("/proc/self/fd")) == opened
    monkeypatch.setattr(shm_module, "MAX_REGIONS", 2)
    regions.register("a", "/obj", 0, 8)
    regions.register("b", "/obj", 0, 8)
    with pytest.raises(SharedMemoryError, match="2 shared memory regions are registered"):
        regions.register("c", "/obj", 0, 8)


def test_only_shared_memory_objects_are_registered(
    regions: SharedMemoryRegions, tmp_path: Path
) -> None:
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for key in ("/dir", "/fifo"):
        with pytest.raises(SharedMemoryError, match=r"is not a shared memory object|Unable to"):
            regions.register("r", key, 0, 8)


@pytest.mark.parametrize("key", ["/", "///", "a/b", "/..", "", None, 7])
def test_an_invalid_key_is_refused(regions: SharedMemoryRegions, key: Any) -> None:
    with pytest.raises(SharedMemoryError, match=r"invalid shm key"):
        regions.register("r", key, 0, 8)


@pytest.mark.parametrize(("offset", "byte_size"), [(0, 257), (1, 256), (256, 1), (257, 0), (0, 0)])
def test_a_range_outside_the_object_is_refused(
    regions: SharedMemoryRegions, offset: int, byte_size: int
) -> None:
    with pytest.raises(SharedMemoryError, match=r"failed to register .*invalid args.*256 bytes"):
        regions.register("r", "/obj", offset, byte_size)
    assert regions.status() == []


def test_register_errors_name_what_to_do(regions: SharedMemoryRegions) -> None:
    regions.register("r", "/obj", 0, 8)
    with pytest.raises(SharedMemoryError, match=r"'r' already in manager; unregister it first"):
        regions.register("r", "/obj", 0, 8)
    with pytest.raises(
        SharedMemoryError, match=r"^Unable to open shared memory region: '/missing' .*create it"
    ):
        regions.register("s", "/missing", 0, 8)
    with pytest.raises(SharedMemoryError, match=r"byte_size must be a non-negative integer"):
        regions.register("s", "/obj", 0, "8")
    with pytest.raises(SharedMemoryError, match=r"a region name is needed"):
        regions.register("", "/obj", 0, 8)


def test_a_view_outside_the_region_is_refused(regions: SharedMemoryRegions) -> None:
    regions.register("r", "/obj", 0, 64)
    with pytest.raises(SharedMemoryError, match=r"Invalid offset for .*'r'"):
        regions.target("r", 64, 1, "output 'y'")
    with pytest.raises(SharedMemoryError, match=r"Invalid offset \+ byte size .*1 \+ 64"):
        regions.target("r", 1, 64, "output 'y'")
    with pytest.raises(SharedMemoryError, match=r"^Integer overflow detected: byte_size \("):
        regions.target("r", 32, 2**64 - 32, "output 'y'")  # Triton's qa sends this one
    with pytest.raises(SharedMemoryError, match=r"'shared_memory_byte_size' is needed"):
        regions.target("r", 0, None, "input 'x'").read()
    with pytest.raises(SharedMemoryNotFoundError, match=r"'nope' \(registered: 'r'\)"):
        regions.target("nope", 0, 8, "input 'x'").read()
    assert len(regions.target("r", None, 64, "input 'x'").read()) == 64  # the offset defaults to 0


def test_disabled_lists_nothing_and_refuses_the_rest(tmp_path: Path) -> None:
    (tmp_path / "obj").write_bytes(bytes(8))
    off = SharedMemoryRegions(allowed=False, root=tmp_path)
    assert off.status() == []
    assert off.cuda_status() == []
    for call in (
        lambda: off.register("r", "/obj", 0, 8),
        lambda: off.unregister(),
        lambda: off.target("r", 0, 8, "input 'x'").read(),
        lambda: off.cuda_unregister(),
    ):
        with pytest.raises(SharedMemoryDisabledError, match=r"--allow-client-shm"):
            call()


def test_cuda_regions_are_refused_with_the_alternative(regions: SharedMemoryRegions) -> None:
    assert regions.cuda_status() == []
    regions.cuda_unregister()
    with pytest.raises(SharedMemoryError, match=r"CUDA shared memory is not supported.*system"):
        regions.cuda_register()
    with pytest.raises(SharedMemoryNotFoundError):
        regions.cuda_status("r")


# -- the REST codec -------------------------------------------------------------------------
def _shm(region: str, size: int, offset: int = 0) -> dict[str, Any]:
    params: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": size}
    return params | ({"shared_memory_offset": offset} if offset else {})


def _request(regions: SharedMemoryRegions, doc: dict[str, Any]) -> protocol.InferRequest:
    return protocol.decode_infer_request(
        orjson.dumps(doc), inputs=IN, outputs=OUT, max_rows=64, regions=regions
    )


def _entry(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "datatype": "INT32", "shape": [1, 16], **fields}


def test_inputs_come_from_and_outputs_go_to_regions(regions: SharedMemoryRegions) -> None:
    regions.register("in", "/obj", 0, 128)
    regions.register("out", "/obj", 128, 128)
    a, b = np.arange(16, dtype="<i4"), np.full(16, 7, "<i4")
    regions.target("in", 0, 128, "setup").write(a.tobytes() + b.tobytes())
    request = _request(regions, {
        "inputs": [_entry("INPUT0", parameters=_shm("in", 64)),
                   _entry("INPUT1", parameters=_shm("in", 64, 64))],
        "outputs": [{"name": "OUTPUT0", "parameters": _shm("out", 64)},
                    {"name": "OUTPUT1", "parameters": {"binary_data": True}}],
    })  # fmt: skip
    np.testing.assert_array_equal(request.inputs["INPUT1"], b.reshape(1, 16))
    results = {"OUTPUT0": (a + b).reshape(1, 16), "OUTPUT1": (a - b).reshape(1, 16)}
    body, header = protocol.encode_infer_response(
        model_name="simple", model_version="1", request=request, results=results, outputs=OUT
    )
    assert header is not None
    doc = orjson.loads(body[:header])
    assert doc["outputs"][0] == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 64}
    written = np.frombuffer(regions.target("out", 0, 64, "check").read(), "<i4")
    np.testing.assert_array_equal(written, a + b)


def test_codec_errors_name_the_tensor_and_the_parameter(regions: SharedMemoryRegions) -> None:
    regions.register("in", "/obj", 0, 256)
    raw = _entry("INPUT1", data=[0] * 16)
    cases = [
        (_entry("INPUT0", parameters=_shm("in", 128)), raw, None,
         r"mismatch for input 'INPUT0'. Expected 64, got 128: shared_memory_byte_size 128"),
        (_entry("INPUT0", data=[0] * 16, parameters=_shm("in", 64)), raw, None,
         "'INPUT0' has 'shared_memory_region' and also 'data'"),
        (_entry("INPUT0", parameters=_shm("gone", 64)), raw, None, r"Unable to find .*'gone'"),
        (raw | {"name": "INPUT0"}, raw, {"binary_data": True} | _shm("in", 64),
         "'binary_data' true and 'shared_memory_region' both set"),
    ]  # fmt: skip
    for first, second, out_params, message in cases:
        outputs = [{"name": "OUTPUT0", "parameters": out_params}] if out_params else None
        doc = {"inputs": [first, second]} | ({"outputs": outputs} if outputs else {})
        with pytest.raises((InputError, SharedMemoryError), match=message):
            _request(regions, doc)


@pytest.mark.parametrize("key", ["shared_memory_offset", "shared_memory_byte_size"])
@pytest.mark.parametrize("where", ["input", "output"])
def test_an_offset_or_size_without_a_region_is_refused(
    regions: SharedMemoryRegions, key: str, where: str
) -> None:
    """A misspelt region key left the size alone: the data went in the message and the client
    read a region nothing wrote. Triton refuses it, naming the tensor."""
    raw = _entry("INPUT1", data=[0] * 16)
    if where == "input":
        doc = {"inputs": [_entry("INPUT0", data=[0] * 16, parameters={key: 64}), raw]}
    else:
        outputs = [{"name": "OUTPUT0", "parameters": {"shared_memory_regoin": "r", key: 64}}]
        doc = {"inputs": [raw | {"name": "INPUT0"}, raw], "outputs": outputs}
    tensor = "INPUT0" if where == "input" else "OUTPUT0"
    with pytest.raises(SharedMemoryError, match=f"{key}' can not be specified without 'shared"):
        _request(regions, doc)
    with pytest.raises(SharedMemoryError, match=f"for tensor '{tensor}'"):
        _request(regions, doc)


def test_an_output_region_too_small_is_refused_before_anything_runs(
    regions: SharedMemoryRegions,
) -> None:
    regions.register("out", "/obj", 0, 100)
    doc = {
        "inputs": [_entry(n, shape=[2, 16], data=[1] * 32) for n in ("INPUT0", "INPUT1")],
        "outputs": [{"name": "OUTPUT0", "parameters": _shm("out", 100)}],
    }
    with pytest.raises(SharedMemoryError, match=r"'OUTPUT0' \(100 bytes\) should be at least 128"):
        _request(regions, doc)


def test_without_a_registry_shared_memory_is_off() -> None:
    doc = {"inputs": [_entry("INPUT0", parameters=_shm("in", 64)), _entry("INPUT1")]}
    with pytest.raises(SharedMemoryDisabledError, match=r"--allow-client-shm"):
        protocol.decode_infer_request(orjson.dumps(doc), inputs=IN, outputs=OUT, max_rows=8)


# -- Triton's clients against a real server --------------------------------------------------
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODEL = "tests.serve.addsub_model:build"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    config = test_config(model=MODEL, name="simple", device="cpu", allow_client_shm=True)
    thread = ServerThread(config).start(timeout=120)
    try:
        yield thread
    finally:
        thread.stop()


def _client(server: ServerThread, kind: str) -> Any:
    if kind == "http":
        return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_tritons_shared_memory_example_runs_unchanged(server: ServerThread, kind: str) -> None:
    """What Triton's simple_{http,grpc}_shm_client.py do, against torchplace."""
    mod = httpclient if kind == "http" else grpcclient
    client = _client(server, kind)
    tag = uuid.uuid4().hex[:8]
    handles = [shm.create_shared_memory_region(f"{n}_{tag}", f"/tp_{n}_{tag}", 128)
               for n in ("in", "out")]  # fmt: skip
    try:
        client.unregister_system_shared_memory()
        client.unregister_cuda_shared_memory()
        a, b = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
        shm.set_shared_memory_region(handles[0], [a])
        shm.set_shared_memory_region(handles[0], [b], offset=64)
        for n in ("in", "out"):
            client.register_system_shared_memory(n, f"/tp_{n}_{tag}", 128)
        inputs = [mod.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
        inputs[0].set_shared_memory("in", 64)
        inputs[1].set_shared_memory("in", 64, offset=64)
        outputs = [mod.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]
        outputs[0].set_shared_memory("out", 64)
        outputs[1].set_shared_memory("out", 64, offset=64)
        result = client.infer("simple", inputs, outputs=outputs)
        assert result.get_output("OUTPUT0") is not None
        got = [shm.get_contents_as_numpy(handles[1], np.int32, [1, 16], offset=o) for o in (0, 64)]
        np.testing.assert_array_equal(got[0][0], a + b)
        np.testing.assert_array_equal(got[1][0], a - b)
        # a raw input next to one in shared memory
        inputs[1] = mod.InferInput("INPUT1", [1, 16], "INT32")
        inputs[1].set_data_from_numpy(np.full((1, 16), 5, np.int32))
        client.infer("simple", inputs, outputs=outputs)
        got0 = shm.get_contents_as_numpy(handles[1], np.int32, [1, 16])
        np.testing.assert_array_equal(got0[0], a + 5)
        status = client.get_system_shared_memory_status()
        names = [r["name"] for r in status] if kind == "http" else list(status.regions)
        assert sorted(names) == ["in", "out"]
        with pytest.raises(InferenceServerException, match=r"already in manager"):
            client.register_system_shared_memory("in", f"/tp_in_{tag}", 128)
        outputs[0].set_shared_memory("out", 64, offset=100)
        with pytest.raises(InferenceServerException, match=r"Invalid offset \+ byte size"):
            client.infer("simple", inputs, outputs=outputs)
        client.unregister_system_shared_memory()
        status = client.get_system_shared_memory_status()
        assert len(status if kind == "http" else status.regions) == 0
    finally:
        client.close()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_unregistering_during_a_request_waits_for_it(kind: str) -> None:
    """Triton's TestSharedMemoryUnregister: regions unregistered while a request that named
    them runs stay listed (and usable) until it is answered, then go."""
    import threading

    config = test_config(model="tests.serve.addsub_model:build_slow", name="simple",
                         device="cpu", allow_client_shm=True, inline_batch_ms=0.0)  # fmt: skip
    tag = uuid.uuid4().hex[:8]
    handle = shm.create_shared_memory_region(f"io_{tag}", f"/tp_io_{tag}", 192)
    try:
        with ServerThread(config) as thread:
            mod = httpclient if kind == "http" else grpcclient
            other = _client(thread, "http")
            shm.set_shared_memory_region(handle, [np.ones(16, np.int32), np.ones(16, np.int32)])
            other.register_system_shared_memory("io", f"/tp_io_{tag}", 192)
            inputs = [mod.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
            for i, inp in enumerate(inputs):
                inp.set_shared_memory("io", 64, offset=64 * i)
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("io", 64, offset=128)
            done: list[Any] = []

            def infer() -> None:  # its own client: tritonclient.http's stays on its thread
                client = _client(thread, kind)
                done.append(client.infer("simple", inputs, outputs=[out]))
                client.close()

            worker = threading.Thread(target=infer)
            worker.start()
            time.sleep(0.4)  # the request is computing (a second)
            other.unregister_system_shared_memory()
            assert [r["name"] for r in other.get_system_shared_memory_status()] == ["io"]
            worker.join(30)
            assert done, "the request was not answered"
            got = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=128)
            np.testing.assert_array_equal(got[0], np.full(16, 2))
            assert other.get_system_shared_memory_status() == []
            other.close()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_server_without_the_flag_refuses_registration() -> None:
    thread = ServerThread(test_config(model=MODEL, name="simple", device="cpu")).start(120)
    try:
        for kind in ("http", "grpc"):
            client = _client(thread, kind)
            status = client.get_system_shared_memory_status()
            assert len(status if kind == "http" else status.regions) == 0
            with pytest.raises(InferenceServerException, match=r"Client shared memory is disabled"):
                client.register_system_shared_memory("r", "/tp_never", 8)
            with pytest.raises(InferenceServerException, match=r"Client shared memory is disabled"):
                client.unregister_system_shared_memory()
            meta = client.get_server_metadata()
            listed = meta["extensions"] if kind == "http" else list(meta.extensions)
            assert "system_shared_memory" not in listed
            client.close()
    finally:
        thread.stop()
