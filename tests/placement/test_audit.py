"""audit_module: parameters and buffers grouped by device and dtype, and every stray tensor found."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from torchplace import (
    ConfigError,
    MixedDeviceError,
    ModuleAudit,
    PlacementError,
    audit_module,
    check_same_device,
)
from torchplace.placement.containers import dtype_name

from .helpers import CPU, META, marked, model, quantized

# --------------------------------------------------------------------------------------------
# audit_module
# --------------------------------------------------------------------------------------------


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))
        self.cache: list[torch.Tensor] = []


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.layers[1].cache.append(torch.zeros(3))  # stray, two levels down
        self.mask = torch.ones(2, 2)  # plain attribute: stray
        self.tables = {"pos": {"sin": torch.zeros(5)}, "ids": (1, torch.arange(3))}
        self.heads = [nn.Linear(4, 1)]  # a module in a plain list: its weights are strays
        self.tags = {"a", "b"}
        self.alias = [self.layers[0].lin.weight]  # a registered parameter: not a stray


def test_audit_groups_by_device_and_dtype() -> None:
    m = Encoder()
    m.layers[0].half()
    audit = audit_module(m)
    groups = {(str(g.device), str(g.dtype)): g for g in audit.groups}
    assert set(groups) == {("cpu", "torch.float16"), ("cpu", "torch.float32")}
    half = groups[("cpu", "torch.float16")]
    assert (half.parameters, half.buffers, half.numel) == (2, 1, 16 + 4 + 4)
    assert half.nbytes == 2 * (16 + 4 + 4)
    full = groups[("cpu", "torch.float32")]
    assert (full.parameters, full.buffers) == (2, 1)
    assert audit.nbytes == half.nbytes + full.nbytes


def test_audit_finds_strays_at_any_depth() -> None:
    audit = audit_module(Encoder())
    names = sorted(s.name for s in audit.strays)
    assert names == sorted(
        [
            "layers.1.cache[0]",
            "mask",
            'tables["pos"]["sin"]',
            'tables["ids"][1]',
            "heads[0].weight",
            "heads[0].bias",
        ]
    )
    assert all(s.kind == "stray" for s in audit.strays)


def test_strays_are_exactly_what_module_to_leaves_behind() -> None:
    m = Encoder()
    m.to("meta")
    audit = audit_module(m)
    left = sorted(r.name for r in audit.off("meta"))
    assert left == sorted(s.name for s in audit.strays)
    assert "alias[0]" in left  # to("meta") swaps parameters, so the alias stays behind
    assert all(r.device == META for r in audit.tensors)


def test_standard_modules_have_no_strays() -> None:
    mods: list[nn.Module] = [
        nn.LSTM(4, 4, num_layers=2),
        nn.GRU(3, 3),
        nn.MultiheadAttention(8, 2),
        nn.BatchNorm1d(3),
        nn.Embedding(10, 4),
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True),
        nn.utils.parametrizations.weight_norm(nn.Linear(3, 3)),
    ]
    for mod in mods:
        assert audit_module(mod).strays == (), type(mod).__name__


def test_audit_renders_as_table_and_json() -> None:
    audit = audit_module(Encoder())
    text = str(audit)
    assert "Encoder" in text
    assert "layers.1.cache[0]" in text
    assert "float32" in text
    data = json.loads(audit.to_json())
    assert data["module"] == "Encoder"
    assert {s["name"] for s in data["strays"]} >= {"mask", "layers.1.cache[0]"}
    assert data["groups"][0]["device"] == "cpu"
    assert data["bytes"] == audit.nbytes
    assert sum(g["parameters"] for g in data["groups"]) == len(list(Encoder().parameters()))

    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(audit)
    assert "layers.1.cache[0]" in console.export_text()


def test_assert_on_lists_everything_off_the_device() -> None:
    m = Encoder()
    with pytest.raises(PlacementError) as info:
        audit_module(m).assert_on("meta")
    msg = str(info.value)
    for name in ("layers.0.lin.weight", "layers.1.scale", "mask", "heads[0].bias"):
        assert name in msg
    assert "module.to('meta')" in msg
    m.to("meta")
    with pytest.raises(PlacementError) as info:
        audit_module(m).assert_on("meta")
    msg = str(info.value)
    assert "layers.0.lin.weight" not in msg
    assert "layers.1.cache[0]" in msg
    # alias[0] too: to("meta") replaces parameters instead of moving them in place (between cpu
    # and cuda it moves them in place, and the alias follows)
    assert "alias[0]" in msg
    assert "7 tensor(s) not on meta, 7 of them stray" in msg
    assert "register_buffer" in msg
    assert "call module.to(" not in msg
    # strays that happen to be on the device are not an error (yet): only placement is checked
    audit_module(Encoder()).assert_on("cpu")


def test_assert_on_passes_and_compares_devices_properly() -> None:
    audit = audit_module(model())
    audit.assert_on("cpu")
    audit.assert_on(torch.device("cpu"))
    audit.assert_on("cpu:0")
    assert isinstance(audit, ModuleAudit)
    assert audit.devices == (CPU,)


def test_audit_is_safe_on_cycles() -> None:
    m = model()
    loop: list[Any] = [torch.ones(1)]
    loop.append(loop)
    m.loop = loop  # type: ignore[assignment]
    m.parent = [m]  # type: ignore[assignment]
    assert [s.name for s in audit_module(m).strays] == ["loop[0]"]


def test_audit_rejects_non_modules() -> None:
    with pytest.raises(ConfigError, match=r"nn\.Module"):
        audit_module(torch.ones(1))  # type: ignore[arg-type]


@pytest.mark.cuda
def test_cuda_check_same_device_and_audit() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    m = model().to(dev)
    assert check_same_device(model=m, x=torch.ones(2, 8, device=dev)) == dev
    assert check_same_device(expected="cuda", model=m) == dev
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(model=m, x=torch.ones(2, 8))
    assert marked(str(info.value)) == ["x"]
    audit_module(m).assert_on("cuda")
    audit_module(m).assert_on(dev)


def test_audit_finds_a_stray_in_a_dataclass_attribute_set_in_post_init() -> None:
    import dataclasses

    @dataclasses.dataclass
    class Rope:
        dim: int

        def __post_init__(self) -> None:
            self.cos = torch.ones(self.dim)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)
            self.rope = Rope(2)

    assert [s.name for s in audit_module(Attention()).strays] == ["rope.cos"]


def test_audit_finds_strays_in_a_deque_and_skips_unset_dataclass_fields() -> None:
    import collections
    import dataclasses

    @dataclasses.dataclass
    class State:
        step: torch.Tensor
        cache: torch.Tensor = dataclasses.field(init=False)

    class Windowed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.history = collections.deque([torch.zeros(2)], maxlen=8)
            self.state = State(torch.zeros(1))

    strays = [s.name for s in audit_module(Windowed()).strays]
    assert strays == ["history[0]", "state.step"]


# --------------------------------------------------------------------------------------------
# quantized modules: weights in packed params, not in parameters() or buffers()
# --------------------------------------------------------------------------------------------


def test_dynamic_qint8_linear_weights_are_audited() -> None:
    q = quantized(
        nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), torch.qint8, {nn.Linear}
    )
    audit = audit_module(q)
    rows = [
        (r.name, r.kind, r.shape, dtype_name(r.dtype), r.device, r.nbytes) for r in audit.tensors
    ]
    assert rows == [
        ("0._packed_params.weight", "packed", (3, 4), "qint8", CPU, 12),
        ("0._packed_params.bias", "packed", (3,), "float32", CPU, 12),
        ("2._packed_params.weight", "packed", (2, 3), "qint8", CPU, 6),
        ("2._packed_params.bias", "packed", (2,), "float32", CPU, 8),
    ]
    assert audit.nbytes == 38  # was 0: a model of quantized layers looked weightless
    groups = {dtype_name(g.dtype): g for g in audit.groups}
    assert (groups["qint8"].parameters, groups["qint8"].numel, groups["qint8"].nbytes) == (
        2,
        18,
        18,
    )
    assert (groups["float32"].parameters, groups["float32"].nbytes) == (2, 20)
    assert audit.devices == (CPU,)
    assert audit.strays == ()
    audit.assert_on("cpu")
    data = json.loads(audit.to_json())
    assert data["bytes"] == 38
    assert data["tensors"][0]["kind"] == "packed"
    assert "0._packed_params.weight" not in str(audit)  # the table shows groups, not names
    assert "qint8" in str(audit)


def test_dynamic_float16_linear_weights_report_their_stored_dtype() -> None:
    q = quantized(nn.Sequential(nn.Linear(4, 3)), torch.float16, {nn.Linear})
    audit = audit_module(q)
    rows = [(r.name, r.shape, dtype_name(r.dtype), r.nbytes) for r in audit.tensors]
    # unpacking gives a float32 copy; the packed weight is stored in float16
    assert rows == [
        ("0._packed_params.weight", (3, 4), "float16", 24),
        ("0._packed_params.bias", (3,), "float32", 12),
    ]
    assert audit.nbytes == 36


def test_packed_weights_left_on_the_cpu_are_a_mixed_device_finding() -> None:
    q = quantized(
        nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2)), torch.qint8, {nn.Linear}
    )
    q.to(META)  # moves the LayerNorm; the packed weights stay on the cpu
    audit = audit_module(q)
    assert audit.devices == (META, CPU)
    assert {str(g.device) for g in audit.groups} == {"meta", "cpu"}
    off = [r.name for r in audit.off(META)]
    assert off == [
        "0._packed_params.weight",
        "0._packed_params.bias",
        "2._packed_params.weight",
        "2._packed_params.bias",
    ]
    with pytest.raises(PlacementError) as info:
        audit.assert_on(META)
    msg = str(info.value)
    assert "4 tensor(s) not on meta, 4 of them packed in quantized modules" in msg
    assert "0._packed_params.weight  packed" in msg
    assert "CPU-only" in msg
    assert "call module.to(" not in msg  # module.to() cannot move them
    assert "register_buffer" not in msg


def test_dynamic_rnns_and_cells_are_audited_once_each() -> None:
    q = quantized(
        nn.ModuleDict({"lstm": nn.LSTM(4, 3), "cell": nn.GRUCell(4, 3), "lin": nn.Linear(2, 2)}),
        torch.qint8,
        {nn.LSTM, nn.GRUCell, nn.Linear},
    )
    audit = audit_module(q)
    names = [r.name for r in audit.tensors]
    assert names == [
        "lstm.weight_ih_l0",
        "lstm.weight_hh_l0",
        "lstm.bias_ih_l0",
        "lstm.bias_hh_l0",
        "cell.weight_ih",
        "cell.weight_hh",
        "lin._packed_params.weight",
        "lin._packed_params.bias",
    ]
    assert [r.shape for r in audit.tensors[:2]] == [(12, 4), (12, 3)]
    assert all(r.kind == "packed" for r in audit.tensors)
    # a quantized cell keeps its biases as plain tensor attributes: strays, listed once
    assert [s.name for s in audit.strays] == ["cell.bias_ih", "cell.bias_hh"]
    assert audit.nbytes == (48 + 36) + 2 * 48 + (36 + 27) + 4 + 8  # GRUCell: 3 gates, 9 rows


def test_static_quantized_conv_weights_are_audited() -> None:
    from torch.ao.nn import quantized as nnq

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated, still used
        conv = nnq.Conv2d(3, 4, 3)  # type: ignore[no-untyped-call]
    audit = audit_module(conv)
    rows = [(r.name, r.shape, dtype_name(r.dtype), r.nbytes) for r in audit.tensors]
    assert rows == [("weight", (4, 3, 3, 3), "qint8", 108), ("bias", (4,), "float32", 16)]


def test_quantized_embeddings_are_audited_and_left_on_the_cpu() -> None:
    qconfig = torch.ao.quantization.float_qparams_weight_only_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated, still used
        q = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            nn.ModuleDict({"tok": nn.Embedding(10, 4), "bag": nn.EmbeddingBag(6, 4)}),
            {nn.Embedding: qconfig, nn.EmbeddingBag: qconfig},
        )
    audit = audit_module(q)
    rows = [(r.name, r.kind, r.shape, dtype_name(r.dtype), r.nbytes) for r in audit.tensors]
    assert rows == [  # was none: an embedding table quantized looked weightless
        ("tok._packed_params.weight", "packed", (10, 4), "quint8", 40),
        ("bag._packed_params.weight", "packed", (6, 4), "quint8", 24),
    ]
    q.to(META)
    assert [r.name for r in audit_module(q).off(META)] == [name for name, *_ in rows]
