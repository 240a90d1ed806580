"""BF16 tensors: declared, validated, staged as float32, cast on the device, rounded on the wire.

The host form of a BF16 tensor is float32 (numpy has no bfloat16): an input crosses
host -> device once as float32 and is cast to bfloat16 on the device; an output is cast to
float32 on the device before its one copy back, and the codec rounds it to bfloat16.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.errors import ConfigError
from torchplace.models import TensorSpec, build_model
from torchplace.serve import cli
from torchplace.serve.config import DATATYPES, ServeConfig, parse_tensor_spec
from torchplace.serve.datatypes import host_numpy_dtype, host_torch_dtype, torch_dtype
from torchplace.serve.engine import Engine
from torchplace.serve.loader import load_model
from torchplace.serve.replica import Replica
from torchplace.serve.running import ServerThread

from .conftest import Client, test_config
from .engine_helpers import CopyCounter, Scale, TwoInTwoOut, loaded, save_exported

httpclient = pytest.importorskip("tritonclient.http")
ml_dtypes = pytest.importorskip("ml_dtypes")
from tritonclient.utils import InferenceServerException  # noqa: E402

CPU = torch.device("cpu")
META = torch.device("meta")
JSON = {"Content-Type": "application/json"}
SEED_BF16 = ("input:BF16:-1,8", "output:BF16:-1,2")


def _bf16_specs(width: int = 4) -> dict[str, tuple[TensorSpec, ...]]:
    return {
        "inputs": (TensorSpec("input", "BF16", (-1, width)),),
        "outputs": (TensorSpec("output", "BF16", (-1, width)),),
    }


def _float32(name: str, x: np.ndarray) -> np.ndarray:
    """The embedded model in float32, in process."""
    with torch.inference_mode():
        out: np.ndarray = build_model(name).eval()(torch.from_numpy(x)).numpy()
    return out


def _bfloat16(name: str, x: np.ndarray) -> np.ndarray:
    """The embedded model in bfloat16 (weights and input), in process, widened to float32."""
    model = build_model(name).eval().to(torch.bfloat16)
    with torch.inference_mode():
        out: np.ndarray = model(torch.from_numpy(x).to(torch.bfloat16)).float().numpy()
    return out


def _within_bf16(got: np.ndarray, want: np.ndarray) -> None:
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * max(scale, 1.0))


def _is_bf16_valued(array: np.ndarray) -> bool:
    """Every value is a bfloat16 (its float32 bits have a zero low half)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    return bool((bits & 0xFFFF == 0).all())


def bf16_seed_factory() -> nn.Module:
    """``--model tests.serve.test_bf16:bf16_seed_factory``: seed-mlp held in bfloat16."""
    model = build_model("seed-mlp").to(torch.bfloat16)
    model.torchplace_inputs = (TensorSpec("input", "BF16", (-1, 8)),)  # type: ignore[assignment]
    model.torchplace_outputs = (TensorSpec("output", "BF16", (-1, 2)),)  # type: ignore[assignment]
    return model


# ---------------------------------------------------------------------- declarations
def test_config_accepts_bf16_declarations() -> None:
    assert "BF16" in DATATYPES
    assert parse_tensor_spec("input:BF16:-1,8") == TensorSpec("input", "BF16", (-1, 8))
    assert parse_tensor_spec("x:bf16:-1,8").datatype == "BF16"
    config = ServeConfig(
        inputs=("input:BF16:-1,8",),  # type: ignore[arg-type]
        outputs=({"name": "output", "datatype": "BF16", "shape": [-1, 2]},),  # type: ignore[arg-type]
    )
    assert config.inputs == (TensorSpec("input", "BF16", (-1, 8)),)
    assert config.outputs == (TensorSpec("output", "BF16", (-1, 2)),)
    with pytest.raises(ConfigError, match="'BYTES' is not servable"):
        parse_tensor_spec("input:BYTES:-1,8")


def test_cli_flags_declare_bf16() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--input", SEED_BF16[0], "--output", SEED_BF16[1], "--dtype", "bf16"])
    config = cli.config_from_args(args)
    assert config.inputs is not None
    assert config.inputs[0].datatype == "BF16"
    assert config.outputs is not None
    assert config.outputs[0].datatype == "BF16"


def test_host_and_device_dtypes_of_bf16() -> None:
    assert host_numpy_dtype("BF16") == np.float32
    assert host_torch_dtype("BF16") == torch.float32
    assert torch_dtype("BF16") == torch.bfloat16
    others = {  # the others are their own host form
        "FP16": (np.float16, torch.float16),
        "FP32": (np.float32, torch.float32),
        "INT64": (np.int64, torch.int64),
        "BOOL": (np.bool_, torch.bool),
    }
    for datatype, (host, device) in others.items():
        assert host_numpy_dtype(datatype) == host
        assert host_torch_dtype(datatype) == device
        assert torch_dtype(datatype) == device
    with pytest.raises(ConfigError, match=r"'BYTES' cannot be served.*BF16"):
        host_numpy_dtype("BYTES")


# ---------------------------------------------------------------------- the replica
@pytest.mark.parametrize("serving", [None, torch.bfloat16], ids=["bf16-model", "dtype-bf16"])
def test_bf16_crosses_once_as_float32_and_is_cast_on_the_device(
    serving: torch.dtype | None,
) -> None:
    # a model held in bfloat16 (no --dtype), or a float32 one cast by --dtype bf16
    module = Scale().to(torch.bfloat16) if serving is None else Scale()
    with CopyCounter() as counter:
        replica = Replica(loaded(module, **_bf16_specs()), META, max_batch_size=8, dtype=serving)
        assert replica._in_casts == (torch.bfloat16,)
        replica.prepare()  # the dry run, with BF16 specs
        assert replica.dry_run_passed
        assert replica.staging is not None
        assert replica.staging.gather([{"input": np.ones((1, 4), np.float32)}], 1)[
            "input"
        ].dtype == (torch.float32)  # staged in the host form
        counter.crossings.clear()
        counter.crossed_dtypes.clear()
        counter.casts.clear()
        requests = [{"input": np.ones((n, 4), np.float32)} for n in (2, 3)]
        outcome = replica.run_batch(requests, [2, 3])
    assert all(isinstance(r, dict) for r in outcome.results)
    assert counter.h2d() == 1  # one batch, one input: one copy in
    assert counter.d2h() == 1  # one output: one copy out
    assert counter.crossed_dtypes == [torch.float32, torch.float32]
    # both casts ran on the device, none on the host
    assert counter.casts == [
        ("meta", torch.float32, torch.bfloat16),
        ("meta", torch.bfloat16, torch.float32),
    ]
    for result, rows in zip(outcome.results, (2, 3), strict=True):
        assert isinstance(result, dict)
        assert (result["output"].dtype, result["output"].shape) == (np.float32, (rows, 4))


def test_the_serving_dtype_wins_over_a_declared_bf16_input() -> None:
    specs = _bf16_specs()
    assert Replica(loaded(Scale(), **specs), CPU, dtype=torch.float32)._in_casts == ()
    assert Replica(loaded(Scale(), **specs), CPU, dtype=torch.float16)._in_casts == (torch.float16,)
    mixed = {
        "inputs": (TensorSpec("a", "BF16", (-1, 3)), TensorSpec("b", "FP32", (-1, 3))),
        "outputs": (TensorSpec("sum", "BF16", (-1, 3)), TensorSpec("prod", "FP32", (-1, 1))),
    }
    replica = Replica(loaded(TwoInTwoOut(), **mixed), CPU)
    assert replica._in_casts == (torch.bfloat16, None)  # only the BF16 one, without --dtype


def test_a_float32_model_with_a_bf16_output_is_rounded_on_the_wire() -> None:
    specs = {
        "inputs": (TensorSpec("input", "FP32", (-1, 4)),),
        "outputs": (TensorSpec("output", "BF16", (-1, 4)),),
    }
    replica = Replica(loaded(Scale(), **specs), CPU, max_batch_size=4)
    assert replica._in_casts == ()
    replica.prepare()
    x = np.full((2, 4), 1.0 + 2**-10, np.float32)
    (result,) = replica.run_batch([{"input": x}], [2]).results
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["output"], x * 2)  # float32 in the server ...

    async def main() -> None:
        engine = Engine(loaded(Scale(), **specs), [CPU], max_batch_size=4)
        thread = ServerThread(test_config(), engine=engine).start(timeout=60)
        try:
            client = Client("127.0.0.1", thread.port)
            body = orjson.dumps(
                {
                    "inputs": [
                        {
                            "name": "input",
                            "datatype": "FP32",
                            "shape": [2, 4],
                            "data": x.ravel().tolist(),
                        }
                    ]
                }
            )
            status, _h, raw = client.post("/v2/models/test-model/infer", body, headers=JSON)
            assert status == 200, raw
            out = orjson.loads(raw)["outputs"][0]
            assert out["datatype"] == "BF16"
            assert out["data"] == [2.0] * 8  # ... rounded to nearest even bfloat16 on the wire
        finally:
            thread.stop()

    asyncio.run(main())


def test_a_float32_model_given_bf16_inputs_fails_start_up_naming_the_fix() -> None:
    async def main() -> None:
        engine = Engine(loaded(nn.Linear(4, 4), **_bf16_specs()), [CPU], max_batch_size=4)
        try:
            await engine.start()
        finally:
            await engine.stop()

    with pytest.raises(ConfigError) as info:
        asyncio.run(main())
    message = str(info.value)
    assert "start-up dry run" in message
    assert "BF16 inputs ['input']" in message
    assert "--dtype bf16" in message


def test_an_exported_bf16_program_declares_bf16(tmp_path: Path) -> None:
    host = Scale().to(torch.bfloat16).eval()
    example = torch.zeros(4, 4, dtype=torch.bfloat16)
    path = save_exported(tmp_path / "scale.pt2", host, example, batch_max=64, batch_min=None)
    model = load_model(exported=path)
    assert [(s.datatype, s.shape) for s in model.inputs] == [("BF16", (-1, 4))]
    assert [(s.datatype, s.shape) for s in model.outputs] == [("BF16", (-1, 4))]

    async def main() -> None:
        engine = Engine(model, [CPU], max_batch_size=8)
        await engine.start()
        try:
            x = np.array([[0.5, -1.25, 3.0, 1.0 + 2**-10]], np.float32)
            out = (await engine.infer({"input": x}))["output"]
            np.testing.assert_array_equal(out, [[1.0, -2.5, 6.0, 2.0]])
        finally:
            await engine.stop()

    asyncio.run(main())


# ---------------------------------------------------------------------- over HTTP
@pytest.fixture(scope="module", params=["dtype-bf16", "bf16-model"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, int]]:
    """seed-mlp with BF16 in/out: cast by --dtype bf16, or held in bfloat16 by its factory."""
    if request.param == "dtype-bf16":
        config = test_config(
            model="seed-mlp",
            device="cpu",
            dtype="bf16",
            inputs=(SEED_BF16[0],),
            outputs=(SEED_BF16[1],),
        )
        name = "seed-mlp"
    else:
        config = test_config(model="tests.serve.test_bf16:bf16_seed_factory", device="cpu")
        name = "bf16_seed_factory"
    thread = ServerThread(config).start(timeout=60)
    try:
        assert thread.app is not None
        name = thread.app.engine.name
        yield name, f"127.0.0.1:{thread.port}", thread.port
    finally:
        thread.stop()


@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
def test_tritonclient_binary_bf16_in_and_out(
    served: tuple[str, str, int], binary_out: bool
) -> None:
    name, url, _port = served
    client = httpclient.InferenceServerClient(url)
    try:
        x = np.random.default_rng(5).standard_normal((5, 8)).astype(np.float32)
        inp = httpclient.InferInput("input", [5, 8], "BF16")
        # this client takes BF16 as ml_dtypes.bfloat16 arrays, sent as binary tensor data
        inp.set_data_from_numpy(x.astype(ml_dtypes.bfloat16), binary_data=True)
        want = httpclient.InferRequestedOutput("output", binary_data=binary_out)
        result = client.infer(name, [inp], outputs=[want])
        response = result.get_output("output")
        assert response["datatype"] == "BF16"
        assert ("parameters" in response) == binary_out
        got = result.as_numpy("output").astype(np.float32)
        assert got.shape == (5, 2)
        _within_bf16(got, _float32("seed-mlp", x))
        np.testing.assert_array_equal(got, _bfloat16("seed-mlp", x))
    finally:
        client.close()


def test_json_bf16_in_and_out(served: tuple[str, str, int]) -> None:
    name, _url, port = served
    x = np.random.default_rng(6).standard_normal((3, 8)).astype(np.float32)
    entry = {"name": "input", "datatype": "BF16", "shape": [3, 8], "data": x.ravel().tolist()}
    status, _h, raw = Client("127.0.0.1", port).post(
        f"/v2/models/{name}/infer", orjson.dumps({"inputs": [entry]}), headers=JSON
    )
    assert status == 200, raw
    out = orjson.loads(raw)["outputs"][0]
    assert (out["datatype"], out["shape"]) == ("BF16", [3, 2])
    got = np.asarray(out["data"], np.float32).reshape(3, 2)
    assert _is_bf16_valued(got)  # JSON carries the numbers bfloat16 holds, like binary
    _within_bf16(got, _float32("seed-mlp", x))
    # the float32 numbers were rounded to bfloat16 on the device, as torch's .to() does
    np.testing.assert_array_equal(got, _bfloat16("seed-mlp", x))


def test_metadata_config_and_openapi_report_bf16(served: tuple[str, str, int]) -> None:
    name, url, port = served
    client = httpclient.InferenceServerClient(url)
    try:
        assert client.is_server_ready()
        assert client.is_model_ready(name)  # the dry run passed with BF16 specs
        meta = client.get_model_metadata(name)
        assert meta["inputs"] == [{"name": "input", "datatype": "BF16", "shape": [-1, 8]}]
        assert meta["outputs"] == [{"name": "output", "datatype": "BF16", "shape": [-1, 2]}]
        config = client.get_model_config(name)
        assert [t["data_type"] for t in config["input"] + config["output"]] == ["TYPE_BF16"] * 2
    finally:
        client.close()
    http = Client("127.0.0.1", port)
    status, _h, raw = http.get("/v2/openapi.json")
    assert status == 200
    assert b'"BF16"' in raw
    # the document's example request is itself a valid BF16 request
    example = _find_example(orjson.loads(raw))
    assert example is not None
    assert example["inputs"][0]["datatype"] == "BF16"
    status, _h, raw = http.post(f"/v2/models/{name}/infer", orjson.dumps(example), headers=JSON)
    assert status == 200, raw


def _find_example(doc: Any) -> dict[str, Any] | None:
    if isinstance(doc, dict):
        if "inputs" in doc and isinstance(doc["inputs"], list) and doc["inputs"]:
            first = doc["inputs"][0]
            if isinstance(first, dict) and "data" in first:
                return doc
        for value in doc.values():
            found = _find_example(value)
            if found is not None:
                return found
    elif isinstance(doc, list):
        for value in doc:
            found = _find_example(value)
            if found is not None:
                return found
    return None


def test_a_mismatched_datatype_is_a_clear_400(served: tuple[str, str, int]) -> None:
    name, url, port = served
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("input", [1, 8], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 8), np.float32))
        with pytest.raises(
            InferenceServerException,
            match=rf"data-type is 'FP32', but model '{name}' expects 'BF16'",
        ):
            client.infer(name, [inp])
        assert client.is_server_ready()
    finally:
        client.close()
    entry = {"name": "input", "datatype": "FP16", "shape": [1, 8], "data": [0.5] * 8}
    status, _h, raw = Client("127.0.0.1", port).post(
        f"/v2/models/{name}/infer", orjson.dumps({"inputs": [entry]}), headers=JSON
    )
    assert status == 400
    assert f"data-type is 'FP16', but model '{name}' expects 'BF16'" in raw.decode()


# ---------------------------------------------------------------------- CUDA
@pytest.mark.cuda
def test_bf16_in_and_out_on_cuda() -> None:
    device = torch.device("cuda", 0)
    config = test_config(
        model="wide-mlp",
        device="cuda:0",
        dtype="bf16",
        inputs=("input:BF16:-1,512",),
        outputs=("output:BF16:-1,512",),
    )
    thread = ServerThread(config).start(timeout=300)
    try:
        assert thread.app is not None
        engine = thread.app.engine
        replica = engine.replicas[0]  # type: ignore[attr-defined]
        assert replica.device == device
        assert replica.is_ready()
        assert replica.staging.is_pinned()
        # the host side holds float32, for the input and for the output buffer
        assert replica.staging.output("output").dtype == torch.float32
        assert {p.dtype for p in replica.module.parameters()} == {torch.bfloat16}
        client = httpclient.InferenceServerClient(f"127.0.0.1:{thread.port}")
        try:
            x = np.random.default_rng(2).standard_normal((16, 512)).astype(np.float32)
            model = build_model("wide-mlp").eval().to(device, torch.bfloat16)
            with torch.inference_mode():
                ref = model(torch.from_numpy(x).to(device).to(torch.bfloat16))
            ref_host = ref.float().cpu().numpy()
            for binary_out in (True, False):
                inp = httpclient.InferInput("input", [16, 512], "BF16")
                inp.set_data_from_numpy(x.astype(ml_dtypes.bfloat16), binary_data=True)
                want = httpclient.InferRequestedOutput("output", binary_data=binary_out)
                result = client.infer("wide-mlp", [inp], outputs=[want])
                got = result.as_numpy("output").astype(np.float32)
                assert got.shape == (16, 512)
                _within_bf16(got, _float32("wide-mlp", x))
                # the same bfloat16 math on the same device (kernels may differ by an ulp)
                np.testing.assert_allclose(got, ref_host, rtol=2e-2, atol=2e-2)
        finally:
            client.close()
    finally:
        thread.stop()
