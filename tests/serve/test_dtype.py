"""``--dtype``: the serving precision. Weights cast once at placement, float inputs cross once in
their wire datatype and are cast on the device, outputs keep their declared datatype."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.cli import main as cli_main
from torchplace.errors import ConfigError
from torchplace.models import TensorSpec, build_model
from torchplace.serve import cli
from torchplace.serve.config import ServeConfig
from torchplace.serve.engine import Engine
from torchplace.serve.loader import load_model
from torchplace.serve.replica import Replica
from torchplace.serve.running import ServerThread

from .conftest import Client, seed_body, test_config
from .engine_helpers import CopyCounter, Scale, loaded, save_exported

CPU = torch.device("cpu")
META = torch.device("meta")
JSON = {"Content-Type": "application/json"}


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


def _reference(name: str, x: np.ndarray) -> np.ndarray:
    """The embedded model in float32, in process."""
    with torch.inference_mode():
        out: np.ndarray = build_model(name).eval()(torch.from_numpy(x)).numpy()
    return out


def _assert_within_bf16(got: np.ndarray, want: np.ndarray) -> None:
    # bf16 keeps 8 significant bits (relative step 2**-8): inputs and weights are rounded once
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * max(scale, 1.0))
    assert not np.array_equal(got, want), "the answer is bit-identical to float32: no cast ran"


class EmbedAndScale(nn.Module):
    """A float input and an integer input: ``emb(ids).sum(1) + x * w``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.weight = nn.Parameter(torch.full((4,), 0.5))
        with torch.no_grad():
            self.emb.weight.copy_(torch.arange(40, dtype=torch.float32).reshape(10, 4) / 8)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.emb(ids).sum(dim=1) + x * self.weight
        return out


def _embed_model() -> Any:
    return loaded(
        EmbedAndScale(),
        inputs=(TensorSpec("x", "FP32", (-1, 4)), TensorSpec("ids", "INT64", (-1, 2))),
    )


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("float32", "float32"),
        ("fp32", "float32"),
        ("float16", "float16"),
        ("FP16", "float16"),
        ("bfloat16", "bfloat16"),
        ("bf16", "bfloat16"),
        (" BF16 ", "bfloat16"),
    ],
)
def test_dtype_names_and_aliases_normalise(given: str, canonical: str) -> None:
    assert ServeConfig(dtype=given).dtype == canonical


def test_no_dtype_by_default() -> None:
    assert ServeConfig().dtype is None
    assert cli.config_from_args(_parse()).dtype is None


@pytest.mark.parametrize("value", ["fp8", "float64", "int8", "", 16])
def test_a_bad_dtype_names_the_value_and_the_choices(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        ServeConfig(dtype=value)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"dtype={value!r}" in message
    assert "float32, float16, bfloat16" in message
    assert "fp32, fp16, bf16" in message


def test_dtype_from_toml_and_json_files(tmp_path: Path) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text('[serve]\nmodel = "wide-mlp"\ndtype = "bf16"\n')
    assert ServeConfig.from_file(toml).dtype == "bfloat16"
    js = tmp_path / "serve.json"
    js.write_text(json.dumps({"dtype": "float16"}))
    assert ServeConfig.from_file(js).dtype == "float16"
    js.write_text(json.dumps({"dtype": "half-ish"}))
    with pytest.raises(ConfigError, match="dtype='half-ish'"):
        ServeConfig.from_file(js)


def _parse(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(list(argv))


def test_the_flag_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "serve.json"
    path.write_text(json.dumps({"dtype": "fp16", "port": 9000}))
    assert cli.config_from_args(_parse("--config", str(path))).dtype == "float16"
    config = cli.config_from_args(_parse("--config", str(path), "--dtype", "bf16"))
    assert (config.dtype, config.port) == ("bfloat16", 9000)


def test_serve_command_exits_2_on_a_bad_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["serve", "--port", "0", "--dtype", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "'fp8'" in err
    assert "bfloat16" in err


def test_replica_refuses_a_non_floating_dtype() -> None:
    with pytest.raises(ConfigError, match=r"torch\.int8"):
        Replica(loaded(Scale()), CPU, dtype=torch.int8)


def test_engine_validates_its_dtype_too() -> None:
    with pytest.raises(ConfigError, match="dtype='double'"):
        Engine(loaded(Scale()), [CPU], dtype="double")
    assert Engine(loaded(Scale()), [CPU], dtype="BF16").dtype == "bfloat16"


# ---------------------------------------------------------------------- the replica
def test_bf16_replica_holds_bf16_weights_and_answers_fp32() -> None:
    replica = Replica(load_model("seed-mlp"), CPU, max_batch_size=8, dtype=torch.bfloat16)
    replica.prepare()
    assert replica.module is not None
    assert {p.dtype for p in replica.module.parameters()} == {torch.bfloat16}
    assert replica.weight_dtypes() == ["bfloat16"]
    assert replica.is_ready()
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    (result,) = replica.run_batch([{"input": x}], [5]).results
    assert isinstance(result, dict)
    assert result["output"].dtype == np.float32  # the declared output datatype
    _assert_within_bf16(result["output"], _reference("seed-mlp", x))


def test_float_inputs_cross_once_in_wire_dtype_and_are_cast_on_the_device() -> None:
    with CopyCounter() as counter:
        replica = Replica(_embed_model(), META, max_batch_size=8, dtype=torch.bfloat16)
        replica.prepare()
        assert replica.module is not None
        table = replica.module.get_submodule("emb").get_parameter("weight")
        assert (table.dtype, table.device) == (torch.bfloat16, META)
        counter.crossings.clear()
        counter.crossed_dtypes.clear()
        counter.casts.clear()
        requests: list[dict[str, np.ndarray]] = [
            {"x": np.ones((n, 4), np.float32), "ids": np.zeros((n, 2), np.int64)} for n in (2, 3)
        ]
        outcome = replica.run_batch(requests, [2, 3])
    assert all(isinstance(r, dict) for r in outcome.results)
    assert counter.h2d() == 2  # one per input, the integer one included
    assert counter.d2h() == 1
    # the float input crossed as FP32 (its wire datatype), the integer one as it is
    assert counter.crossed_dtypes[:2] == [torch.float32, torch.int64]
    assert counter.crossed_dtypes[2] == torch.float32  # the output, cast before D2H
    # every cast ran on the device: the float input to bf16, the output back to FP32;
    # the integer input was not cast, and nothing was cast on the host
    assert counter.casts == [
        ("meta", torch.float32, torch.bfloat16),
        ("meta", torch.bfloat16, torch.float32),
    ]


def test_without_a_dtype_nothing_is_cast() -> None:
    replica = Replica(_embed_model(), META, max_batch_size=8)
    assert replica._in_casts == ()  # the hot path's one check
    with CopyCounter() as counter:
        replica.prepare()
        counter.crossings.clear()
        counter.casts.clear()
        request: dict[str, np.ndarray] = {
            "x": np.ones((2, 4), np.float32),
            "ids": np.zeros((2, 2), np.int64),
        }
        (result,) = replica.run_batch([request], [2]).results
    assert isinstance(result, dict)
    assert counter.h2d() == 2
    assert counter.d2h() == 1
    assert counter.casts == []


def test_float32_serving_of_fp32_inputs_adds_no_input_cast() -> None:
    replica = Replica(_embed_model(), CPU, max_batch_size=4, dtype=torch.float32)
    assert replica._in_casts == ()
    replica = Replica(_embed_model(), CPU, max_batch_size=4, dtype=torch.float16)
    assert replica._in_casts == (torch.float16, None)  # the FP32 input only, not the INT64


def test_integer_inputs_keep_their_dtype_values_on_cpu() -> None:
    replica = Replica(_embed_model(), CPU, max_batch_size=4, dtype=torch.bfloat16)
    replica.prepare()
    x = np.full((2, 4), 2.0, np.float32)
    ids = np.array([[1, 9], [0, 3]], np.int64)
    (result,) = replica.run_batch([{"x": x, "ids": ids}], [2]).results
    assert isinstance(result, dict)
    with torch.inference_mode():
        want = EmbedAndScale()(torch.from_numpy(x), torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(result["output"], want, rtol=1e-2)


# ---------------------------------------------------------------------- the engine
class _Inverse(nn.Module):
    """Uses an op CPU torch does not implement in half precision (linalg.inv)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(4, dtype=x.dtype, device=x.device)
        out: torch.Tensor = x @ torch.linalg.inv(eye + torch.diag(self.weight))
        return out


class _FixedTemporary(nn.Module):
    """Builds a float32 temporary whatever the input dtype (not dtype-agnostic)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weight) @ torch.eye(4, device=x.device)


def fixed_temporary_factory() -> nn.Module:
    """``--model tests.serve.test_dtype:fixed_temporary_factory``."""
    return _FixedTemporary()


def _start_fails(engine: Engine) -> ConfigError:
    async def main() -> None:
        try:
            await engine.start()
        finally:
            await engine.stop()

    with pytest.raises(ConfigError) as info:
        run(main)
    return info.value


def test_float16_on_cpu_serves_a_linear_model() -> None:
    async def main() -> None:
        engine = Engine(load_model("seed-mlp"), [CPU], max_batch_size=4, dtype="fp16")
        await engine.start()
        try:
            x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
            out = (await engine.infer({"input": x}))["output"]
            assert out.dtype == np.float32
            np.testing.assert_allclose(out, _reference("seed-mlp", x), atol=5e-3)
            assert engine.replicas[0].weight_dtypes() == ["float16"]
        finally:
            await engine.stop()

    run(main)


@pytest.mark.parametrize(
    ("module", "dtype", "needle"),
    [
        (_Inverse, "float16", "Low precision dtypes not supported"),
        (_FixedTemporary, "bfloat16", "dtype"),
    ],
)
def test_a_dtype_the_model_cannot_run_fails_start_up_naming_dtype_and_device(
    module: type[nn.Module], dtype: str, needle: str
) -> None:
    message = str(_start_fails(Engine(loaded(module()), [CPU], max_batch_size=4, dtype=dtype)))
    assert "start-up dry run" in message
    assert f"--dtype {dtype}" in message
    assert "on cpu" in message
    assert needle in message  # the model's own error
    assert "without --dtype" in message  # the fix

    async def without_dtype() -> None:  # the same model starts in its own dtypes
        engine = Engine(loaded(module()), [CPU], max_batch_size=4)
        await engine.start()
        await engine.stop()

    run(without_dtype)


def test_serve_command_exits_2_when_the_model_cannot_run_the_dtype(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["serve", "--device", "cpu", "--port", "0", "--dtype", "bf16", "--model"]
    argv += ["tests.serve.test_dtype:fixed_temporary_factory"]
    argv += ["--input", "input:FP32:-1,4", "--output", "output:FP32:-1,4"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "--dtype bfloat16 on cpu" in err
    assert "KernelError" not in err


def test_the_start_up_record_shows_the_dtype(caplog: pytest.LogCaptureFixture) -> None:
    async def main(dtype: str | None) -> dict[str, Any]:
        engine = Engine(
            load_model("seed-mlp"), [CPU], max_batch_size=4, dtype=dtype, fallback="cpu"
        )
        with caplog.at_level(logging.INFO, logger="torchplace.serve"):
            await engine.start()
        await engine.stop()
        return engine.startup_record

    record = run(lambda: main("bf16"))
    logged = next(
        json.loads(r.getMessage()) for r in caplog.records if "serve.start" in r.getMessage()
    )
    assert logged == record
    assert record["dtype"] == "bfloat16"
    assert [r["weight_dtypes"] for r in record["replicas"]] == [["bfloat16"], ["bfloat16"]]
    host_bytes = record["weight_bytes"]  # the host model, float32
    assert [r["weight_bytes"] for r in record["replicas"]] == [host_bytes // 2] * 2
    plain = run(lambda: main(None))
    assert plain["dtype"] is None
    assert plain["replicas"][0]["weight_dtypes"] == ["float32"]
    assert plain["replicas"][0]["weight_bytes"] == plain["weight_bytes"]


def test_an_exported_program_serves_in_bf16(tmp_path: Path) -> None:
    host = build_model("seed-mlp").eval()
    path = save_exported(
        tmp_path / "seed.pt2", host, torch.zeros(4, 8), batch_max=64, batch_min=None
    )

    async def main() -> None:
        engine = Engine.from_config(
            ServeConfig(exported=path, device="cpu", max_batch_size=8, dtype="bf16")
        )
        await engine.start()
        try:
            x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
            out = (await engine.infer({"input": x}))["output"]
            _assert_within_bf16(out, _reference("seed-mlp", x))
            assert engine.replicas[0].weight_dtypes() == ["bfloat16"]
        finally:
            await engine.stop()

    run(main)


# ---------------------------------------------------------------------- over HTTP
def test_bf16_end_to_end_over_http(caplog: pytest.LogCaptureFixture) -> None:
    config = test_config(model="seed-mlp", device="cpu", dtype="bf16", max_batch_size=8)
    with caplog.at_level(logging.INFO, logger="torchplace.serve"):
        thread = ServerThread(config).start(timeout=60)
    try:
        client = Client("127.0.0.1", thread.port)
        x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
        status, _headers, body = client.post(
            "/v2/models/seed-mlp/infer", seed_body(x), headers=JSON
        )
        assert status == 200, body
        out = orjson.loads(body)["outputs"][0]
        assert out["datatype"] == "FP32"  # a bf16 model still answers its declared FP32
        got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        _assert_within_bf16(got, _reference("seed-mlp", x))
        config_doc = orjson.loads(client.get("/v2/models/seed-mlp/config")[2])
        assert config_doc["parameters"] == {"dtype": {"string_value": "bfloat16"}}
        meta = orjson.loads(client.get("/v2/models/seed-mlp")[2])
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}]
        assert thread.app is not None
        module = thread.app.engine.replicas[0].module  # type: ignore[attr-defined]
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    finally:
        thread.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert any("serving seed-mlp version 1 (bfloat16) on http://" in line for line in lines)


def test_no_dtype_leaves_the_config_document_as_it_was(start_server: Any) -> None:
    running = start_server()
    doc = orjson.loads(running.client.get("/v2/models/seed-mlp/config")[2])
    assert "parameters" not in doc


# ---------------------------------------------------------------------- CUDA
@pytest.mark.cuda
def test_bf16_on_cuda_serves_within_tolerance_of_fp32() -> None:
    device = torch.device("cuda", 0)

    async def main() -> None:
        engine = Engine(load_model("wide-mlp"), [device], max_batch_size=32, dtype="bfloat16")
        await engine.start()
        try:
            replica = engine.replicas[0]
            assert replica.module is not None
            assert all(p.device == device for p in replica.module.parameters())
            assert {p.dtype for p in replica.module.parameters()} == {torch.bfloat16}
            assert replica.is_ready()
            rng = np.random.default_rng(0)
            xs = [rng.standard_normal((2, 512)).astype(np.float32) for _ in range(16)]
            results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
            for x, result in zip(xs, results, strict=True):
                assert result["output"].dtype == np.float32
                _assert_within_bf16(result["output"], _reference("wide-mlp", x))
            record = engine.startup_record
            assert record["dtype"] == "bfloat16"
            assert record["replicas"][0]["weight_dtypes"] == ["bfloat16"]
            assert record["replicas"][0]["pinned_staging"] is True
        finally:
            await engine.stop()

    run(main)
