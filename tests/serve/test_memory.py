"""The memory check before a load: estimates, the refusal's numbers, a real server refusing."""

from __future__ import annotations

import http.client
from pathlib import Path

import orjson
import pytest
import torch

from torchplace.errors import ConfigError, InsufficientMemoryError
from torchplace.serve.config import ServeConfig
from torchplace.serve.loader import load_model
from torchplace.serve.memory import MemoryCheck, _cast_bytes, estimate
from torchplace.serve.running import ServerThread

from .conftest import test_config
from .repository_helpers import write_model

WIDE = 'source = "wide-mlp"\n[batching]\nmax_batch_size = 8\n'


def test_the_memory_budget_is_read_as_bytes_or_a_size() -> None:
    assert ServeConfig().with_overrides({"memory_budget": 1024}).memory_budget == 1024
    assert ServeConfig().with_overrides({"memory_budget": "512MiB"}).memory_budget == 512 * 2**20
    assert ServeConfig().with_overrides({"memory_budget": "2 GB"}).memory_budget == 2 * 10**9
    with pytest.raises(ConfigError, match="memory_budget: cannot read the size 'lots'"):
        ServeConfig().with_overrides({"memory_budget": "lots"})


def test_estimate_is_weights_plus_an_activation_peak_growing_with_the_batch() -> None:
    loaded = load_model("wide-mlp")
    small, large = estimate(loaded, 1), estimate(loaded, 64)
    assert small > loaded.weight_bytes
    # 64 rows of 2048-wide float32 activations at least, over one row's
    assert large - small >= 63 * 2048 * 4


def test_a_serving_dtype_is_estimated_as_the_replicas_hold_it() -> None:
    # --dtype bf16 halves the floating weights and activations: a budget must not be charged
    # the float32 size the model was built in
    loaded = load_model("wide-mlp")
    full, half = estimate(loaded, 8), estimate(loaded, 8, "bfloat16")
    assert loaded.weight_bytes // 2 < half < loaded.weight_bytes
    assert full - half >= loaded.weight_bytes // 2
    assert estimate(loaded, 8, "float32") == full


def test_a_serving_dtype_leaves_integer_buffers_their_size() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    counter = module[1].num_batches_tracked  # int64: .to(bfloat16) leaves it as it is
    floats = sum(t.numel() for t in (*module.parameters(), *module.buffers()) if t is not counter)
    assert _cast_bytes(module, "bfloat16") == floats * 2 + counter.element_size()
    assert _cast_bytes(module, "bfloat16") == sum(
        t.numel() * t.element_size() for t in (*module.to(torch.bfloat16).parameters(),
                                               *module.buffers())
    )  # fmt: skip


def test_the_estimate_traces_a_meta_copy_without_copying_the_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchplace.serve import memory

    model = load_model("seed-mlp").module
    before = {name: p.data_ptr() for name, p in model.named_parameters()}

    def copied_weights(self: object, memo: object) -> None:
        pytest.fail("a weight tensor was deep-copied on the host")

    for kind in (torch.Tensor, torch.nn.Parameter):  # what a plain deepcopy would call
        monkeypatch.setattr(kind, "__deepcopy__", copied_weights)
    copied = memory._on_meta(model)
    assert all(p.device.type == "meta" for p in copied.parameters())
    assert all(isinstance(p, torch.nn.Parameter) for p in copied.parameters())
    assert [n for n, _ in copied.named_parameters()] == list(before)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_a_load_over_the_budget_is_refused_with_the_numbers() -> None:
    check = MemoryCheck(budget=1000)
    check.reserve("a/1", {"cpu": 600})
    check.check("b", {"cpu": 400}, owner="")  # fits exactly
    with pytest.raises(InsufficientMemoryError) as caught:
        check.check("b", {"cpu": 401}, owner="")
    message = str(caught.value)
    assert "model 'b' needs 0.0 MiB (401 bytes) on cpu" in message
    assert "only 0.0 MiB (400 bytes) is free" in message
    assert "budget: 0.0 MiB (1000 bytes); held by loaded models: 0.0 MiB (600 bytes)" in message
    assert caught.value.status == 409
    check.release("a/1")
    check.check("b", {"cpu": 1000}, owner="")


def test_the_device_probe_counts_too() -> None:
    check = MemoryCheck(probe=lambda device: 10 if device == "cuda:0" else None)
    check.check("m", {"cpu": 10**12}, owner="")  # no budget, no probe: nothing to check
    with pytest.raises(InsufficientMemoryError, match=r"device free: 0.0 MiB \(10 bytes\)"):
        check.check("m", {"cuda:0": 11}, owner="")


def _post(port: int, path: str, body: bytes = b"{}") -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    return response.status, orjson.loads(raw) if raw else {}


def test_a_server_refuses_a_load_over_the_budget_and_keeps_serving(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        write_model(tmp_path, name)
    write_model(tmp_path, "big", config=WIDE, weights=False)
    seed = estimate(load_model("seed-mlp"), 8)
    wide = estimate(load_model("wide-mlp"), 8)
    budget = 2 * seed + wide  # a, b and c leave one seed short of what big needs
    config = test_config(
        device="cpu", model_repository=tmp_path, model_control_mode="explicit",
        load_models=("a", "b", "c"), memory_budget=budget,
    )  # fmt: skip
    with ServerThread(config) as thread:
        status, body = _post(thread.port, "/v2/repository/models/big/load")
        assert status == 409
        message = body["error"]
        assert f"model 'big' needs {wide / 2**20:.1f} MiB ({wide} bytes) on cpu" in message
        assert f"budget: {budget / 2**20:.1f} MiB ({budget} bytes)" in message
        assert f"held by loaded models: {3 * seed / 2**20:.1f} MiB ({3 * seed} bytes)" in message
        assert f"only {(budget - 3 * seed) / 2**20:.1f} MiB" in message
        status, index = _post(thread.port, "/v2/repository/index")
        big = [e for e in index if e["name"] == "big"]  # type: ignore[union-attr]
        assert big[0]["state"] == "UNAVAILABLE"
        assert "needs" in big[0]["reason"]
        infer = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8],
                             "data": [0.5] * 8}]}  # fmt: skip
        assert _post(thread.port, "/v2/models/a/infer", orjson.dumps(infer))[0] == 200
        assert _post(thread.port, "/v2/repository/models/a/unload")[0] == 200
        assert _post(thread.port, "/v2/repository/models/big/load")[0] == 200  # fits now


def test_the_refusal_over_grpc_is_resource_exhausted(tmp_path: Path) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    write_model(tmp_path, "big", config=WIDE, weights=False)
    config = test_config(
        device="cpu", model_repository=tmp_path, model_control_mode="explicit",
        memory_budget=1024,
    )  # fmt: skip
    with ServerThread(config) as thread:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{thread.grpc_port}")
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("big")
        assert "StatusCode.RESOURCE_EXHAUSTED" in str(caught.value.status())
        assert "model 'big' needs" in caught.value.message()
        assert client.is_server_live()


@pytest.mark.cuda
def test_a_load_over_the_free_cuda_memory_is_refused(tmp_path: Path) -> None:
    """On a real GPU, against torch.cuda.mem_get_info: 16 replicas of wide-mlp at 2**20 rows
    per batch (the most a batch may hold) need about 256 GiB of activations (estimated on meta;
    nothing is allocated)."""
    import torch

    free, _ = torch.cuda.mem_get_info(0)
    huge = (
        'source = "wide-mlp"\ndevices = ["cuda:0"]\nreplicas = 16\n'
        "[batching]\nmax_batch_size = 1048576\n"
    )
    write_model(tmp_path, "huge", config=huge, weights=False)
    write_model(tmp_path, "small", config='source = "seed-mlp"\ndevices = ["cuda:0"]\n')
    config = test_config(
        device="cuda:0", model_repository=tmp_path, model_control_mode="explicit",
        load_models=("small",),
    )  # fmt: skip
    with ServerThread(config) as thread:
        status, body = _post(thread.port, "/v2/repository/models/huge/load")
        assert status == 409, body
        assert "model 'huge' needs" in body["error"]
        assert "on cuda:0" in body["error"]
        assert "device free: " in body["error"]
        assert "device free: unknown" not in body["error"]
        print(body["error"], f"(free before: {free} bytes)")
        infer = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8],
                             "data": [0.5] * 8}]}  # fmt: skip
        assert _post(thread.port, "/v2/models/small/infer", orjson.dumps(infer))[0] == 200
