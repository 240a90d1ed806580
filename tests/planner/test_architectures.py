"""Architectures users bring (tests/planner/archs.py), planned on ``meta`` and run for real on
the CPU: weights and buffers counted once each as a direct sum over the module counts them, a
JSON report that validates, a device map that plans back to the same placement, ``--verify``
agreeing with the plan; then the bugs those models found, one test each, and hostile arguments
to ``plan()`` and ``torchplace plan`` not covered by tests/test_api_hostile.py and
tests/test_cli_hostile.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.planner import archs
from tests.planner.conftest import NO_RESERVES
from torchplace import report
from torchplace.cli import main
from torchplace.errors import ConfigError, PlacementError
from torchplace.planner import verify as verify_module
from torchplace.planner.api import Plan, plan
from torchplace.planner.exercise import exercise_rows
from torchplace.planner.fused import autocast_on_meta, kernels
from torchplace.planner.render import export_device_map, render_text
from torchplace.planner.trace import UntraceableModel
from torchplace.planner.units import unit_tensors
from torchplace.planner.verify import verify

#: the models' sequence length, where their inputs have one (their position tables hold 64)
SEQ = {
    "tiny_gpt": 8,
    "wrapped_gpt": 8,
    "makes_tensors_like_input": 8,
    "tiny_gpt_on_cpu": 8,
    "cached_gpt": 8,  # its KV cache holds 16 positions
    "whisper": 8,  # its decoder holds 32 positions
    "grouped_query": 8,
    "bfloat16_mixed": 8,
    "translation": 8,
    "translation_unpadded": 8,
    "attention_seq2seq": 6,
    "conformer": 24,  # 5 frames after its two strided convolutions
    "rope_in_forward": 8,
    "mixture_of_depths": 8,
    "hf_encoder": 8,
    "streaming": 6,
}

#: factories whose forward cannot run on ``meta`` (tested one by one below) or that are too big
#: to run for real
UNTRACEABLE = {
    "data_dependent",
    "item_call",
    "nonzero",
    "makes_tensors",
    "moves_to_cuda",
    "moves_to_cpu",
    "packed",
    "quantized_dynamic",
}
ON_META = {"on_meta", "big_tied"}
FACTORIES = sorted(
    name.removeprefix("make_")
    for name in dir(archs)
    if name.startswith("make_") and name.removeprefix("make_") not in UNTRACEABLE
)
RUNNABLE = [f for f in FACTORIES if f not in ON_META]


def arch_plan(factory: str, **options: Any) -> Plan:
    """``tests.planner.archs:make_FACTORY`` at batch 2 on two 1 GiB devices without reserves."""
    settings: dict[str, Any] = {
        "batch_sizes": [2],
        "assume": "2x1GiB",
        "reserves": NO_RESERVES,
        "seq": SEQ.get(factory),
    }
    if factory == "big_tied":
        settings.update(assume="4xH200", reserves=(), seq=16)
    return plan(f"tests.planner.archs:make_{factory}", **{**settings, **options})


def _unique(tensors: Any) -> int:
    """Bytes of these tensors' storages, each storage once."""
    seen: dict[int, int] = {}
    for t in tensors:
        seen[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
    return sum(seen.values())


def direct_bytes(module: torch.nn.Module) -> tuple[int, int]:
    """Parameter and buffer bytes summed over the module directly, a shared tensor once."""
    return _unique(module.parameters()), _unique(module.buffers())


def held_bytes(p: Plan, device: str) -> tuple[int, int]:
    """What ``device`` holds, summed directly over the tensors of the units placed there."""
    params: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    for unit in p.units.units:
        if p.placement.replicas == 1 and p.placement.device_of(unit.path) != device:
            continue
        owned, held = unit_tensors(p.model.module, unit.path)
        params += owned.values()
        buffers += held.values()
    return _unique(params), _unique(buffers)


# ------------------------------------------------------------------------ every architecture


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_replica_holds_each_parameter_and_buffer_once(factory: str) -> None:
    p = arch_plan(factory, strategy="replicate")
    budget = p.budgets["cuda:0"]
    assert (budget.weights, budget.buffers) == direct_bytes(p.model.module)


@pytest.mark.parametrize("factory", FACTORIES)
def test_each_pipeline_device_holds_its_units_tensors_once(factory: str) -> None:
    p = arch_plan(factory, strategy="pipeline")
    for device, budget in p.budgets.items():
        assert (budget.weights, budget.buffers) == held_bytes(p, device), device


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_model_placed_whole_is_one_row_of_its_own_bytes(factory: str) -> None:
    # accelerate puts a model that fits whole on the first device: {"": 0}, one unit
    devices = 4 if factory == "big_tied" else 2
    p = arch_plan(factory, strategy="accelerate", max_memory=[1 << 40] * devices)
    (unit,) = p.units.units
    params, buffers = direct_bytes(p.model.module)
    assert (unit.weight_bytes, unit.buffer_bytes) == (params, buffers)
    row = p.to_dict()["placement"][0]
    assert (row["param_bytes"], row["buffer_bytes"]) == (params, buffers)


@pytest.mark.parametrize("factory", FACTORIES)
def test_the_report_validates_and_its_device_map_plans_back(factory: str, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    p = arch_plan(factory, strategy="pipeline")
    document = json.loads(report.to_json(report.envelope("plan", p.to_dict(), device="x")))
    jsonschema.validate(document, report.load_schema("plan"))
    assert render_text(p).count("Exercise 8") == 1
    export_device_map(p, tmp_path / "map.json")
    again = arch_plan(factory, map_file=tmp_path / "map.json")
    assert again.placement.assign == p.placement.assign


@pytest.mark.parametrize("strategy", ["replicate", "pipeline", "accelerate"])
@pytest.mark.parametrize("factory", RUNNABLE)
def test_verify_on_the_cpu_agrees_with_the_plan(factory: str, strategy: str) -> None:
    p = arch_plan(factory, strategy=strategy)
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


# ------------------------------------------------------------------------ counting


def test_a_tie_inside_one_unit_is_counted_once_in_its_row() -> None:
    # was 36.00 KiB for 32.88 KiB of weights: the wrapper's one unit holds the token embedding
    # and the head tied to it, and its row summed both names
    p = arch_plan("wrapped_gpt", strategy="replicate")
    (unit,) = p.units.units
    assert unit.path == "transformer"
    assert unit.weight_bytes == p.budgets["cuda:0"].weights == direct_bytes(p.model.module)[0]
    assert "36.00 KiB" not in render_text(p)


def test_a_layer_repeated_in_a_module_list_is_counted_once() -> None:
    # ALBERT-style: one Linear held four times; accelerate's root unit counted it four times
    p = arch_plan("repeated_layer", strategy="accelerate", max_memory=[1 << 30] * 2)
    assert p.units.units[0].weight_bytes == (16 * 16 + 16 + 16 * 2 + 2) * 4


def test_a_buffer_shared_by_four_blocks_is_held_once_per_device() -> None:
    # one 16 KiB table registered in four blocks was counted four times (64 KiB)
    table = 256 * 16 * 4
    replica = arch_plan("shared_buffer", strategy="replicate")
    assert replica.budgets["cuda:0"].buffers == table
    split = arch_plan("shared_buffer", strategy="pipeline")
    assert len(split.budgets) == 2
    assert all(b.buffers == table for b in split.budgets.values())


def test_verify_size_limit_counts_a_tied_weight_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the 4 GiB limit summed the units' rows: a model of 3.98 GiB with a tied head was refused
    # as 5.0 GiB. Here: 33,664 B of weights, 36,864 B with the tie counted twice
    p = arch_plan("tiny_gpt", strategy="replicate")
    monkeypatch.setattr(verify_module, "MAX_VERIFY_BYTES", 35_000)
    assert verify(p, devices=["cpu"]).ok


def test_a_factory_that_built_real_weights_is_planned_on_meta_with_its_ties() -> None:
    # a factory that loads a pickled model or a checkpoint holds CPU weights: the trace failed
    # with "Tensor on device cpu is not on the expected device meta!"
    p = arch_plan("tiny_gpt_on_cpu", strategy="pipeline")
    module = p.model.module
    assert all(t.device.type == "meta" for t in (*module.parameters(), *module.buffers()))
    assert module.lm_head.weight is module.wte.weight
    assert p.units.tied == (("lm_head.weight", "wte.weight"),)
    whole = arch_plan("tiny_gpt", strategy="pipeline")
    assert [b.weights for b in p.budgets.values()] == [b.weights for b in whole.budgets.values()]
    assert verify(p, devices=["cpu"]).ok


def test_a_billion_parameter_model_on_meta_plans_without_allocating() -> None:
    start = time.perf_counter()
    p = arch_plan("big_tied", strategy="pipeline")
    assert time.perf_counter() - start < 60
    params = direct_bytes(p.model.module)[0]
    assert params == (128_000 * 4096 + 12 * 2 * 4096 * 4 * 4096) * 2  # tied head counted once
    assert [w.code for w in p.warnings] == ["tied-split"]  # the head is on the last device
    assert sum(b.weights for b in p.budgets.values()) == params + 128_000 * 4096 * 2


# ------------------------------------------------------------------------ views and copies


def _mapped(factory: str, mapping: dict[str, int | str], tmp_path: Path, **options: Any) -> Plan:
    path = tmp_path / "map.json"
    path.write_text(json.dumps(mapping))
    return arch_plan(factory, map_file=path, **options)


def test_chunks_handed_to_units_elsewhere_cross_as_three_copies(tmp_path: Path) -> None:
    # q, k, v = qkv(x).chunk(3): the plan counted one copy of the whole storage (3x the bytes of
    # one chunk), and the runner handed k and v the copy of q
    p = _mapped("chunks", {"qkv": 0, "q": 1, "k": 1, "v": 1}, tmp_path)
    inner = [c for c in p.flow.crossings if c.kind == "d2d"]
    assert [(c.consumer, c.shape, c.nbytes, c.count) for c in inner] == [
        ("q", (2, 16), 2 * 16 * 4, 1),
        ("k", (2, 16), 2 * 16 * 4, 1),
        ("v", (2, 16), 2 * 16 * 4, 1),
    ]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_token_handed_on_and_a_token_returned_cross_with_their_own_bytes(
    tmp_path: Path,
) -> None:
    # h[:, 0] to the head and logits[:, -1] returned: the plan counted each one's storage
    p = _mapped("cls_head", {"body": 0, "head": 1, "lm": 1}, tmp_path)
    head = next(c for c in p.flow.crossings if c.consumer == "head")
    assert (head.shape, head.nbytes) == ((2, 16), 2 * 16 * 4)
    outs = sorted((c.shape, c.nbytes) for c in p.flow.crossings if c.kind == "d2h")
    assert outs == [((2, 2), 2 * 2 * 4), ((2, archs.VOCAB), 2 * archs.VOCAB * 4)]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_an_expanded_tensor_crosses_at_its_expanded_size(tmp_path: Path) -> None:
    # Tensor.to materialises a stride-0 view: the copy is the batch's size, not the one row
    p = _mapped("expanded", {"gate": 0, "mul": 1}, tmp_path)
    (inner,) = [c for c in p.flow.crossings if c.kind == "d2d"]
    assert (inner.shape, inner.nbytes) == ((2, 16), 2 * 16 * 4)
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_two_views_of_one_activation_reach_their_units_with_their_own_shapes(
    tmp_path: Path,
) -> None:
    # the runner handed c the copy of h made for b (32x16 for a 8x64 input): "mat1 and mat2
    # shapes cannot be multiplied"
    p = _mapped("two_shapes", {"a": 0, "b": 1, "c": 1}, tmp_path)
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


@pytest.mark.parametrize("strategy", ["replicate", "pipeline"])
def test_verify_runs_a_model_that_flattens_its_input_in_its_own_code(strategy: str) -> None:
    # was PlacementError: "Cannot set version_counter for inference tensor"
    p = arch_plan("flatten", strategy=strategy)
    assert verify(p, devices=["cpu"]).ok


def test_verify_leaves_no_error_in_a_finalizer(monkeypatch: pytest.MonkeyPatch) -> None:
    # the tracker took an input copy's bytes off a device that never counted them: a KeyError
    # printed as "Exception ignored in: <finalize object ...>" (or live bytes gone negative)
    raised: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", raised.append)
    for factory, strategy in [("identity", "pipeline"), ("flatten", "accelerate")]:
        verify(arch_plan(factory, strategy=strategy), devices=["cpu"])
    assert [r.exc_value for r in raised] == []


def test_a_model_placed_whole_that_returns_its_input_returns_it_from_its_device() -> None:
    # nn.Identity as the one unit: it gets the input's copy and returns it; the plan had no copy
    # back to the host (measured 128 B x1)
    p = arch_plan("identity", strategy="pipeline")
    back = [c for c in p.flow.crossings if c.kind == "d2h"]
    assert [(c.src, c.nbytes) for c in back] == [(p.placement.device_of(""), 2 * 16 * 4)]
    assert verify(p, devices=["cpu"]).ok


def test_batch_norm_in_inference_keeps_no_statistics_as_cudnn_runs_it() -> None:
    # meta's kernel returns the two per-feature statistics; in inference the CPU's and cuDNN's
    # return empty ones (the CPU's allocates them inside, so its allocator sees them)
    mlp = 2 * 64 * 4  # one (2, 64) float32 activation
    p = arch_plan("batch_norm_mlp", strategy="replicate")
    assert p.budgets["cuda:0"].activation[2] == 2 * mlp
    with kernels("cpu"):
        cpu = arch_plan("batch_norm_mlp", strategy="replicate")
    assert cpu.traces[2].peak() == 2 * mlp + 2 * 64 * 4
    assert verify(p, devices=["cpu"]).ok  # was +50%: the tracker sees no statistics


# ------------------------------------------------------------------------ rendering


def test_module_names_with_pipes_and_brackets_render_as_they_are() -> None:
    # a ModuleDict key "a|b" split its rows (one more cell than the header has); "[/]" was a
    # rich MarkupError traceback ("closing tag '[/]' ... has nothing to close")
    p = arch_plan("odd_names", strategy="pipeline")
    text = render_text(p)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    tables: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.startswith("|"):
            tables[-1].append(line)
        elif tables[-1]:
            tables.append([])
    for table in (t for t in tables if t):
        cells = {len(line.replace("\\|", "").split("|")) for line in table}
        assert len(cells) == 1, table
    assert any("heads.a\\|b" in row for row in rows)
    assert all(any(f"heads.{name} " in row for row in rows) for name in ("[CLS]", "[/]"))


# ------------------------------------------------------------------------ strategies


def test_accelerate_places_a_model_without_parameters_on_the_first_device() -> None:
    # accelerate's map of a model with no parameters is empty: the plan placed nothing and said
    # "DOES NOT FIT" (exit 1) with no warning
    p = arch_plan("no_params", strategy="accelerate")
    assert p.fits()
    assert p.device_map() == {"": 0}
    assert p.budgets["cuda:0"].activation[2] == 2 * 16 * 4 * 2


# ------------------------------------------------------------------------ forward signatures


def test_a_forward_that_takes_its_inputs_as_keyword_arguments_is_planned() -> None:
    p = arch_plan("var_keyword", strategy="pipeline")
    assert [c.consumer for c in p.flow.crossings if c.kind == "h2d"] == ["a", "(model code)"]
    assert verify(p, devices=["cpu"]).ok


def test_a_slice_of_a_buffer_handed_to_a_unit_elsewhere_crosses_as_the_slice(
    tmp_path: Path,
) -> None:
    # was the whole 64-row table, and once more for each read of it inside the unit
    (tmp_path / "map.json").write_text('{"device_map": {"table": 0, "a": 0, "b": 1}}')
    p = arch_plan("sliced_table", map_file=tmp_path / "map.json")
    (crossing,) = [c for c in p.flow.crossings if c.producer == "table"]
    assert (crossing.shape, crossing.nbytes, crossing.count) == ((6, archs.W), 6 * archs.W * 4, 1)


def test_an_encoder_and_decoder_given_a_causal_mask_are_planned() -> None:
    # was a PlacementError: torch reads the mask's values to tell whether it is causal
    p = arch_plan("causal_encoder", strategy="pipeline")
    assert [u.path for u in p.units.units] == ["mask", "encoder", "decoder"]
    assert p.flow.bytes_between_devices() > 0


# ------------------------------------------------------------------------ clear refusals


@pytest.mark.parametrize("factory", ["data_dependent", "item_call", "nonzero"])
def test_a_forward_that_reads_values_is_a_placement_error(factory: str) -> None:
    with pytest.raises(PlacementError, match="control flow reads tensor values"):
        arch_plan(factory)


def test_a_tensor_made_without_a_device_is_named_as_the_fault() -> None:
    # was: "... a model whose control flow reads tensor values cannot be planned this way"
    with pytest.raises(UntraceableModel) as exc:
        arch_plan("makes_tensors")
    assert "device=" in str(exc.value)
    assert "control flow" not in str(exc.value)


@pytest.mark.parametrize("factory", ["moves_to_cpu", "moves_to_cuda"])
def test_a_forward_that_moves_tensors_itself_is_named_as_the_fault(factory: str) -> None:
    # was "control flow reads tensor values" (.cpu()) or "check the declared inputs" (.cuda())
    with pytest.raises(UntraceableModel) as exc:
        arch_plan(factory)
    message = str(exc.value)
    assert "moves a tensor" in message
    assert "control flow" not in message
    assert "declared inputs" not in message


@pytest.mark.parametrize(
    "refusal",
    [
        "Torch not compiled with CUDA enabled",  # a CPU build
        "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
        "installed a driver from http://www.nvidia.com/Download/index.aspx",  # CUDA, no driver
        "No CUDA GPUs are available",  # a driver without a GPU
    ],
)
def test_a_forward_moving_to_cuda_is_named_whatever_torch_says_of_the_gpu(
    refusal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # .cuda() asks torch.cuda._lazy_init, whose refusal depends on the build and the machine: a
    # CUDA build from PyPI on a machine without a driver said "check the declared inputs"
    def refuse() -> None:
        raise RuntimeError(refusal)

    monkeypatch.setattr(torch.cuda, "_lazy_init", refuse)
    with pytest.raises(UntraceableModel) as exc:
        arch_plan("moves_to_cuda")
    assert "moves a tensor" in str(exc.value)
    assert refusal.split(".")[0] in str(exc.value)


def test_verify_of_a_sequence_past_the_position_table_is_one_clear_error() -> None:
    # the plan runs on meta, where an embedding reads no index; the real run raised an
    # IndexError traceback (exit 1 with a stack), not verify's one-line PlacementError
    p = arch_plan("tiny_gpt", strategy="replicate", seq=100)  # 64 positions
    with pytest.raises(PlacementError, match="IndexError"):
        verify(p, devices=["cpu"])


def test_verify_refuses_a_model_its_factory_builds_on_meta_clearly() -> None:
    # was a NotImplementedError traceback: "Cannot copy out of meta tensor; no data!"
    p = arch_plan("on_meta", strategy="replicate")
    with pytest.raises(ConfigError, match="meta"):
        verify(p, devices=["cpu"])


# ------------------------------------------------------------------------ hostile arguments


@pytest.mark.parametrize("reserves", [[5], None, "margin=0.1", [b"margin=0.1"]])
def test_plan_refuses_reserves_that_are_not_a_list_of_strings(reserves: object) -> None:
    # [5]: AttributeError 'int' object has no attribute 'partition'; None: TypeError;
    # "margin=0.1": read letter by letter ("cannot read --reserve 'm'")
    with pytest.raises(ConfigError, match="reserve"):
        plan(reserves=reserves)  # type: ignore[arg-type]


def test_plan_refuses_an_empty_max_memory() -> None:
    # max_memory=[] was taken as "not given": the plan used its own budgets without a word
    with pytest.raises(ConfigError, match="max_memory"):
        plan(max_memory=[])


def test_numpy_integers_give_a_report_of_integers(tmp_path: Path) -> None:
    # batch sizes, seq and max_memory from numpy were written as strings ("2") in the JSON
    # report (its default=str), and the exported device map failed (int64 is not JSON)
    np = pytest.importorskip("numpy")
    p = plan(
        "gpt2-like",
        batch_sizes=np.array([1, 2]),
        seq=np.int64(8),
        max_memory=[np.int64(1 << 30)] * 2,
        strategy="pipeline",
    )
    document = json.loads(report.to_json(p.to_dict()))
    assert document["batch_sizes"] == [1, 2]
    assert document["seq"] == 8
    assert document["max_memory"] == {"cuda:0": 1 << 30, "cuda:1": 1 << 30}
    export_device_map(p, tmp_path / "map.json")


@pytest.mark.parametrize(
    ("batch", "seq"), [(1, 2**40), (2**31, 2**31)], ids=["seq-huge", "batch-times-seq"]
)
def test_plan_refuses_inputs_too_big_to_make(batch: int, seq: int) -> None:
    # seq 2**40: "Storage size calculation overflowed" blamed on control flow; batch and seq
    # 2**31: an uncaught RuntimeError
    with pytest.raises(ConfigError, match=r"seq|input"):
        plan("gpt2-like", batch_sizes=[batch], seq=seq)


def test_cli_refuses_a_sequence_length_past_int64_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # was a RuntimeError with a C++ frame dump, exit 1
    assert main(["plan", "--model", "gpt2-like", "--seq", "99999999999999999999"]) == 2
    err = capsys.readouterr().err
    assert "--seq" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("map_file", [5, ["map.json"]])
def test_plan_refuses_a_map_file_that_is_not_a_path(map_file: object) -> None:
    # 5: TypeError "expected str, bytes or os.PathLike object, not int"
    with pytest.raises(ConfigError, match="map"):
        plan(map_file=map_file)  # type: ignore[arg-type]


def test_a_map_that_sends_a_module_to_true_is_refused(tmp_path: Path) -> None:
    # JSON true is an int to Python: it was taken as device 1
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"0": True, "1": 0, "2": 0}))
    with pytest.raises(ConfigError, match="True"):
        plan(map_file=path)


@pytest.mark.parametrize("inputs", [[5], "x:FP32:-1,8"], ids=["int", "str"])
def test_plan_refuses_inputs_that_are_not_tensor_specs(inputs: object) -> None:
    # was "cannot build the model 'seed-mlp': AttributeError: 'int' object has no attribute
    # 'name'; the factory is called with no arguments ..." (the factory was fine)
    with pytest.raises(ConfigError, match="TensorSpec"):
        plan(inputs=inputs)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", [5, None])
def test_plan_refuses_a_model_that_is_not_a_string(model: object) -> None:
    # was "cannot build the model 5: TypeError: argument of type 'int' is not iterable"
    with pytest.raises(ConfigError, match=r"model=.*string"):
        plan(model)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ as libraries write


def _small(factory: str, devices: int, size: int, **options: Any) -> Plan:
    """``factory`` on ``devices`` devices of ``size`` bytes each, that budget for weights too:
    small enough that the model's big modules are split into their children."""
    options = {"assume": f"{devices}x{size}B", "max_memory": [size] * devices, **options}
    return arch_plan(factory, **options)


def test_a_vit_under_accelerates_hooks_verifies() -> None:
    # transformers' ViTModel keeps the embeddings' output alive while its encoder runs: the
    # runner kept the hooks' copy of it on cuda:1 as long (through layer 1 too), where the
    # hooks' copy dies with the call it was made for (measured 25% over the plan on cuda:1)
    p = _small("vit", 3, 20_000, strategy="accelerate")
    assert p.placement.device_of("vit.encoder.layer.0") == "cuda:1"
    assert p.placement.device_of("vit.encoder.layer.1") == "cuda:1"
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_tuple_argument_is_copied_to_the_unit_as_its_tensors() -> None:
    # Llama's layers take (cos, sin) as one keyword argument: the run handed the tuple on
    # without copying its tensors (measured 1,088 B x2 where the plan had 1,600 B x4), and on
    # real devices the layer would read them from another device
    p = _small("rotary_decoder", 2, 20_000, strategy="pipeline")
    late = {p.placement.device_of(f"layers.{i}") for i in range(4)}
    assert late == {"cuda:0", "cuda:1"}
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
    hooked = _small("rotary_decoder", 3, 20_000, strategy="accelerate")
    verdict = verify(hooked, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_unit_spilled_to_the_host_hands_on_activations_not_inputs() -> None:
    # accelerate puts what does not fit on 'cpu': ln_f there hands its output to lm_head on
    # cuda:1; the run counted that copy as a model input (no activation), the plan as an
    # activation (the plan 31% over the run on cuda:1)
    p = arch_plan(
        "tiny_gpt", strategy="accelerate", assume="3x19610B", max_memory=[14_000] * 3, seq=8
    )
    assert p.placement.device_of("ln_f") == "cpu"
    assert p.placement.device_of("lm_head") == "cuda:1"
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_declared_inputs_go_to_the_forward_parameters_of_their_names() -> None:
    # T5's forward(input_ids, attention_mask=None, decoder_input_ids=None) with inputs
    # (input_ids, decoder_input_ids): the decoder's ids went to attention_mask ("its forward
    # raised ValueError: decoder_input_ids is required")
    p = arch_plan("seq2seq", strategy="pipeline", seq=6)
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_an_lstm_without_projections_verifies_on_the_cpu() -> None:
    # the run on the CPU took oneDNN's one operator per layer, whose steps the tracker does not
    # see: the plan (the steps, as meta takes them) was 137% over the run at batch 2
    p = arch_plan("lstm_lm", strategy="pipeline")
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
    assert all(m["error"] == 0 for m in verdict.memory)


def test_buffers_spilled_to_the_host_normalise_the_input_and_verify() -> None:
    # accelerate leaves the top-level mean and std on 'cpu': their result is copied to 'a' on
    # cuda:1. The run took it for a model input (its storage at the address of a freed copy of
    # the input, still listed as one) and left it out of cuda:1's peak (the plan 43% over)
    p = _small("normalized", 2, 3681, strategy="accelerate", max_memory=[3335] * 2)
    assert {p.placement.device_of("mean"), p.placement.device_of("a")} == {"cpu", "cuda:1"}
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_weight_handed_to_a_hooked_unit_is_read_there_as_its_copy() -> None:
    # a top-level causal mask (a buffer left on 'cpu') handed to each layer: the hooks copy it
    # for the call, and the layer reads that copy; the plan copied it once more for the layer's
    # own reads of it (2,048 B x2 planned, 1,024 B x1 measured)
    p = _small("cached_gpt", 2, 29612, strategy="accelerate", max_memory=[26440] * 2)
    assert p.placement.device_of("causal") == "cpu"
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
    mask = [c for c in p.flow.crossings if c.producer == "causal"]
    assert [(c.consumer, c.nbytes, c.count) for c in mask] == [("layers.0", 256, 1)]


def test_a_storage_made_where_a_freed_input_was_is_no_input() -> None:
    from torchplace.planner.runner import _Runtime

    rt = _Runtime(set())
    t = torch.ones(4)
    rt.hold(t, "cpu")
    key = t.untyped_storage()._cdata
    rt.inputs.add(key)
    del t
    assert key not in rt.inputs


def test_a_module_past_the_max_memory_given_is_split_as_accelerate_splits_it() -> None:
    # --max-memory 27,590 B on three 1 GiB devices: units were split only past a device's
    # capacity, so Whisper's 31,488 B encoder stayed one unit; accelerate, told not to split
    # it, found no device for it and left the whole model on the host ({"": "cpu"}), and
    # --balance fill sent the encoder to the host with two devices empty
    budget = [27_590] * 3
    p = arch_plan("whisper", strategy="accelerate", assume="3x1GiB", max_memory=budget, seq=8)
    assert "model.encoder" not in p.units.paths
    assert all(u.weight_bytes <= budget[0] for u in p.units.units)
    assert {0, 1, 2} <= set(p.device_map().values())
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
    filled = arch_plan(
        "whisper", strategy="pipeline", balance="fill", assume="3x1GiB", max_memory=budget, seq=8
    )
    assert filled.placement.device_of("model.encoder.conv1") == "cuda:0"
    assert {filled.placement.device_of(f"model.encoder.layers.{i}") for i in (0, 1)} == {"cuda:1"}


def test_fill_keeps_a_unit_without_weights_beside_the_one_before_it() -> None:
    # --balance fill ordered the units as compute_module_sizes lists them, which has no entry
    # for a module without weights: every ReLU and Dropout came first, on cuda:0. DETR's
    # backbone.5 (a ReLU) went to cuda:0 between backbone.4 and input_projection on cuda:1
    # (a return trip), the decoder's dropouts to cuda:0 between units on the host, and
    # --verify measured a copy the plan did not have (768 B x1 to linear2)
    p = arch_plan(
        "detr", strategy="pipeline", balance="fill", assume="3x1GiB", max_memory=[12_399] * 3
    )
    device = p.placement.device_of
    assert device("backbone.2") == device("backbone.1") == "cuda:0"
    assert device("backbone.5") == device("backbone.4") == "cuda:1"
    decoder = "transformer.decoder.layers.0"
    assert device(f"{decoder}.dropout") == device(f"{decoder}.linear1")
    assert "return-trip" not in [w.code for w in p.warnings]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_module_list_placed_whole_runs_its_layers_as_calls_of_it() -> None:
    # accelerate's map names CLIP's vision_model.layers (an nn.ModuleList) whole when both
    # layers land on one device; a ModuleList has no forward, so its layers' operators were
    # found by their weights alone and the copies around them went astray (--verify: cuda:2
    # -> cpu at (model code), planned 320 B x1, measured 0 B x0). accelerate hooks each layer
    p = arch_plan("clip", strategy="accelerate", assume="3x1GiB", max_memory=[15_742] * 3)
    assert p.device_map()["vision_model.layers"] == "cpu"
    calls = [c for c in p.traces[2].calls if c.unit == "vision_model.layers"]
    assert len(calls) == 2
    assert all(c.forward for c in calls)
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_module_whose_code_reads_its_pieces_weights_together_is_not_split() -> None:
    # nn.MultiheadAttention hands in_proj_weight, in_proj_bias and out_proj's weight (never
    # calling out_proj) to one fused kernel: past the 4,132 B --max-memory it was split into
    # those three, placed on three devices (in_proj_bias last, on cuda:3); --verify measured
    # other copies (0 B x0 for 384 B x1 planned to out_proj) and cuda:3's peak 47% under. Kept
    # whole, it is over the budget, which the report says
    p = arch_plan(
        "self_attention_stack", strategy="pipeline", assume="4x1GiB", max_memory=[4_132] * 4
    )
    assert [u.path for u in p.units.units if u.path.startswith("attn")] == [
        "attn.0",
        "attn.1",
        "attn.2",
    ]
    assert "over-max-memory" in [w.code for w in p.warnings]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_hooks_copy_a_tensor_given_twice_twice_and_attention_leaves_its_fast_path() -> None:
    # attn(h, h, h) on another device than h: accelerate's hooks call Tensor.to per argument,
    # so the layer gets three copies, and nn.MultiheadAttention, seeing query is not key,
    # leaves its fused self-attention path. The plan had one copy and the fast path: 768 B x1
    # planned, 2,304 B x3 measured, and cuda:1's peak 16% under the run
    p = arch_plan(
        "self_attention_stack", strategy="accelerate", assume="2x1GiB", max_memory=[8201] * 2
    )
    assert p.placement.device_of("attn.0") == "cuda:1"
    into = [c for c in p.flow.crossings if c.consumer == "attn.0"]
    assert sum(c.count for c in into) == 3
    assert {c.nbytes for c in into} == {2 * 6 * archs.W * 4}
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
    assert all(m["error"] == 0 for m in verdict.memory)


def test_what_a_dropout_returns_under_hooks_is_the_copy_it_was_handed() -> None:
    # nn.TransformerDecoderLayer split by accelerate: self_attn on cuda:3, dropout1 and norm1
    # on the host. dropout1 returns the hooks' copy of self_attn's output, on the host; the plan
    # took it for the original on cuda:3 and copied it to the host again for the residual
    # (cuda:3 -> cpu at (model code): 768 B x2 planned, 0 B x0 measured)
    p = arch_plan("detr", strategy="accelerate", assume="4x1GiB", max_memory=[9315] * 4)
    layer = "transformer.decoder.layers.0"
    assert p.placement.device_of(f"{layer}.self_attn") == "cuda:3"
    assert p.placement.device_of(f"{layer}.dropout1") == "cpu"
    assert not [c for c in p.flow.crossings if c.src == "cuda:3" and c.consumer == "(model code)"]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_embedding_bags_verify_on_the_cpu_as_the_planned_kernel_makes_them() -> None:
    # nn.EmbeddingBag's CPU kernel returns other auxiliary tensors than CUDA's, which meta's
    # follow (in sum mode an empty offset2bag and a per-bag max_indices, the reverse on CUDA):
    # --verify's tracker counted the CPU's, 17% under the plan on cuda:0 at batch 2
    p = arch_plan("dlrm", strategy="pipeline", assume="2x1GiB", max_memory=[80_879] * 2)
    assert p.placement.device_of("tables.0") == "cuda:0"
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
    assert all(m["error"] == 0 for m in verdict.memory)
    # the hooks hand each table its column of the ids, sliced by the model's code elsewhere
    hooked = arch_plan("dlrm", strategy="accelerate", assume="3x1GiB", max_memory=[53_940] * 3)
    verdict = verify(hooked, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_auto_with_nothing_that_fits_takes_the_plan_least_past_the_budget() -> None:
    # nothing on the devices alone fits Whisper in 27,590 B per device, so every such
    # candidate's largest batch is 0 and auto took the first: replicate, 71,808 B of weights on
    # each device, 2.6x the budget, where a pipeline's fullest device is 1.1x
    from torchplace.planner.api import _best

    options: dict[str, Any] = {"assume": "3x1GiB", "max_memory": [27_590] * 3, "seq": 8}
    plans = [
        arch_plan("whisper", strategy="replicate", **options),
        arch_plan("whisper", strategy="pipeline", **options),
    ]
    p = _best(plans)
    assert not p.fits()
    assert p.placement.strategy.startswith("pipeline")
    assert all(b.weights + b.buffers < 2 * 27_590 for b in p.budgets.values())
    # auto itself now also weighs fill, which keeps within the budget by leaving the last
    # decoder layer on the host: it fits, and is taken
    auto = arch_plan("whisper", **options)
    assert auto.fits()
    assert auto.placement.strategy == "pipeline-fill"
    assert [w.code for w in auto.warnings] == ["cpu-spill"]


def test_a_view_the_models_code_takes_of_an_input_crosses_from_where_it_took_it() -> None:
    # edge_index = edges.t(), taken by the model's code on cuda:0 of the input's copy there:
    # the plan took it for the input itself, on the host, and copied it from there to each
    # later layer (cpu -> cuda:1: 32 B x1 planned, 0 B x0 measured; cuda:0 -> cuda:1: 160 B
    # x2 measured for 128 B x1)
    p = arch_plan("gnn", strategy="pipeline", assume="3x1GiB", max_memory=[2865] * 3)
    ids = [(c.src, c.dst, c.consumer) for c in p.flow.crossings if c.dtype == "int64"]
    assert ids == [
        ("cpu", "cuda:0", "(model code)"),
        ("cuda:0", "cuda:1", "convs.1"),
        ("cuda:0", "cuda:2", "convs.2"),
    ]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_strided_part_read_again_elsewhere_reads_its_own_copy(tmp_path: Path) -> None:
    # edge_index[1] (stride 2, offset 1) read twice by a layer's code on cuda:1: the second
    # read took the cached copy (dense, 16 B) as a copy of the whole storage and viewed it at
    # the part's offset and stride: "setStorage: ... out of bounds for storage of size 16"
    mapping: dict[str, int | str] = {"enc": 0, "convs.0.lin": 1, "convs.0.root": 2}
    mapping |= {"convs.1.lin": 3, "convs.1.root": "cpu", "convs.2": "cpu", "out": "cpu"}
    p = _mapped("gnn", mapping, tmp_path, assume="4x1GiB")
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_accelerate_with_everything_on_the_host_copies_nothing_to_a_device() -> None:
    # accelerate's main device is the first of its map that is not the host; with the whole
    # model on the host ({"": "cpu"}) there is none and nothing moves. The plan sent the inputs
    # to cuda:0 and back to the host, and the outputs the same way (and the table showed
    # cuda:0 holding the inputs and the outputs of a model it holds nothing of)
    p = arch_plan("whisper", strategy="accelerate", max_memory=[100] * 2, seq=8)
    assert p.device_map() == {"": "cpu"}
    assert p.flow.crossings == []
    assert [w.code for w in p.warnings] == ["cpu-spill"]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_hooks_return_a_plain_dataclass_as_it_is() -> None:
    # accelerate's send_to_device moves tensors, tuples, lists and dicts, and returns a plain
    # dataclass as it is: CLIP's embeddings, made on the host, stay there. The plan (and the
    # run) sent them to cuda:0 and back (cpu -> cuda:0 at (model return): 128 B x2)
    p = arch_plan("clip", strategy="accelerate", assume="3x1GiB", max_memory=[15_742] * 3)
    assert p.traces[2].unmoved == frozenset(range(4))
    assert not [c for c in p.flow.crossings if c.consumer == "(model return)"]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
    assert not [e for e in verdict.edges if e["consumer"] == "(model return)"]


def test_a_copy_for_the_models_code_lives_as_long_as_its_storage(tmp_path: Path) -> None:
    # an exported graph takes a view for each operator (MultiheadAttention's batch-first
    # transposes): --verify kept the copy of one only while that view lived, and copied the
    # storage again for the next (768 B x1 planned, 1,536 B x2 measured)
    model = archs.make_self_attention_stack().eval()
    program = torch.export.export(model, (torch.randn(2, 6, 8),))
    path = tmp_path / "attention.pt2"
    torch.export.save(program, path)
    p = plan(
        "exported",
        exported=path,
        batch_sizes=[2],
        assume="3x1GiB",
        max_memory=[9000] * 3,
        strategy="pipeline",
        reserves=NO_RESERVES,
    )
    assert len(p.budgets) == 3
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


# ------------------------------------------------------------------ round four: other mechanisms


def test_a_view_of_another_units_weight_verifies(tmp_path: Path) -> None:
    # a decoder reading the encoder's weight as encoder.weight.t() on another device: --verify
    # failed ("Cannot set version_counter for inference tensor": the view taken of the weight's
    # copy); the view is now taken of the weight, and what reads it copies it, once
    mapping = {"encoder": 0, "middle": 1, "decoder": 2, "scale": 0}
    mapped = _mapped("transposed_share", mapping, tmp_path, assume="3x1GiB")
    hooked = arch_plan(
        "transposed_share", strategy="accelerate", assume="3x1GiB", max_memory=[5000] * 3
    )
    for p in (mapped, hooked):
        assert p.placement.device_of("encoder") != p.placement.device_of("decoder")
        weight = [c for c in p.flow.crossings if (c.producer, c.consumer) == ("encoder", "decoder")]
        assert [(c.shape, c.nbytes, c.count) for c in weight] == [((4 * 16, 16), 4096, 1)]
        verdict = verify(p, devices=["cpu"])
        assert verdict.ok, verdict.render()


def test_a_factory_that_cannot_run_on_meta_is_built_on_the_cpu_and_planned_on_meta() -> None:
    # parametrizations.orthogonal's initialiser calls .item(): "cannot build the model ...
    # Tensor.item() cannot be called on meta tensors; the factory must take no arguments"
    p = arch_plan("orthogonal", strategy="pipeline", max_memory=[3000, 3000])
    module = p.model.module
    assert all(t.device.type == "meta" for t in (*module.parameters(), *module.buffers()))
    assert len(p.budgets) == 2
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_padding_check_in_the_models_code_reads_its_operands_there(tmp_path: Path) -> None:
    # nn.TransformerEncoder's own code checks its padding mask with the source beside it: the
    # plan put that read on the next operator, the first layer's (512 B x1 planned there, 0 B
    # x0 measured; the model code's edge 8 B x1 planned, 520 B x2 measured)
    opened = ("transformer.encoder.layers.0", "transformer.encoder.layers.1")
    rest = ("transformer.encoder.norm", "transformer.decoder", "generator")
    mapping = {"src_embed": 0, "tgt_embed": 1, **dict.fromkeys(opened + rest, 1)}
    p = _mapped("translation", mapping, tmp_path)
    (source,) = [c for c in p.flow.crossings if c.producer == "src_embed"]
    assert (source.consumer, source.nbytes, source.count) == ("(model code)", 2 * 8 * 16 * 4, 1)
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_verify_runs_a_padding_mask_without_padding_as_the_plan_does() -> None:
    # a source without padding has a left-aligned mask: the CPU ran the encoder on nested
    # tensors, which the plan (an upper bound) has not ("NestedTensorImpl doesn't support
    # sizes", from every strategy's --verify)
    p = arch_plan("translation_unpadded", strategy="replicate")
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_exercise_rows_show_only_the_models_inputs_and_outputs_as_such() -> None:
    # with units spilled to the host, a stage's activation handed to them was shown as the
    # model's final output ("2x8x8x8 float32 to host" on cuda:2, the output being 2x10)
    p = arch_plan(
        "convnext", strategy="pipeline", balance="fill", assume="3x1GiB", max_memory=[5120] * 3
    )
    assert p.placement.device_of("head.3") == "cpu"
    _, rows = exercise_rows(p)
    table = dict(rows)
    assert table["final outputs"] == ["-", "-", "-"]
    assert table["input batch (batch 2)"] == ["-", "2x3x32x32 float32 from host", "-"]
    spilled = arch_plan("convnext", strategy="accelerate", assume="3x1GiB", max_memory=[5120] * 3)
    table = dict(exercise_rows(spilled)[1])
    # (accelerate's main device is cuda:1: the blocks' class, split where past the budget, is
    # no longer given to accelerate as one not to split, so the first stage is split too)
    assert (
        "cpu -> cuda:1: head output to (model return), 2x10 float32"
        in table["cross-device copies in"][1]
    )


def test_a_packed_sequence_is_named_as_needing_values() -> None:
    # the advice was to leave the move to the caller, which pack_padded_sequence forbids (its
    # lengths must be on the CPU, and are read)
    with pytest.raises(UntraceableModel, match="pack_padded_sequence"):
        arch_plan("packed")


def test_an_exported_program_with_devices_burnt_in_plans_on_meta(tmp_path: Path) -> None:
    # torch.arange(t, device=x.device) and torch.zeros(..., device=x.device) are recorded with
    # the export's device (cpu): "Tensor on device meta is not on the expected device cpu",
    # blamed on control flow, and "Cannot copy out of meta tensor" for the FFT model
    examples = {
        "grouped_query": (
            torch.randint(0, archs.VOCAB, (2, 8)),
            torch.ones(2, 8, dtype=torch.long),
        ),
        "spectral": (torch.randn(2, 8, 16),),
    }
    for name, example in examples.items():
        model = getattr(archs, f"make_{name}")().eval()
        path = tmp_path / f"{name}.pt2"
        torch.export.save(torch.export.export(model, example), path)
        options: dict[str, Any] = {"batch_sizes": [2], "assume": "3x1GiB", "reserves": NO_RESERVES}
        p = plan("exported", exported=path, strategy="pipeline", max_memory=[3000] * 3, **options)
        assert len(p.budgets) == 3
        verdict = verify(p, devices=["cpu"])
        assert verdict.ok, verdict.render()


def test_autocast_turned_off_for_the_inputs_device_traces_on_meta() -> None:
    # transformers' rotary embeddings run under torch.autocast(x.device.type, enabled=False):
    # on meta "unsupported scalarType", blamed on control flow; and torch.is_autocast_enabled
    # of meta ("unknown device type for autocast")
    p = arch_plan("grouped_query", strategy="pipeline")
    assert len(p.budgets) == 2
    with autocast_on_meta():
        assert torch.is_autocast_enabled("meta") is False
        with torch.autocast("meta", dtype=torch.bfloat16):
            assert not torch.is_autocast_enabled("cpu")


def test_a_parameter_list_is_opened_so_each_tensor_goes_with_its_layer() -> None:
    # a ParameterList (and a ParameterDict) was one unit: the activation went to its device for
    # each scale and back (cuda:2 -> cuda:1 -> cuda:0 -> cuda:2, a return-trip warning, 2.50 KiB
    # between devices for 1.00 KiB)
    p = arch_plan("layer_scales", strategy="pipeline", assume="3x1GiB", max_memory=[16384] * 3)
    assert {"scales.0", "scales.2", "gains.first", "gains.last"} <= set(p.units.paths)
    assert p.placement.device_of("scales.2") == p.placement.device_of("layers.2")
    assert "return-trip" not in [w.code for w in p.warnings]
    assert p.flow.bytes_between_devices() == 2 * 512
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_a_pipeline_by_memory_balances_buffers_too() -> None:
    # float8 weights are buffers: --balance memory balanced parameters alone and put three
    # 4,352 B layers on one device with 7,000 B of --max-memory (over-max-memory, exit 1), where a
    # pipeline by compute fitted
    p = arch_plan("float8", strategy="pipeline", assume="3x1GiB", max_memory=[7000] * 3)
    assert p.fits(), [w.message for w in p.warnings]
    assert len(p.budgets) == 3
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


@pytest.mark.parametrize("balance", ["memory", "compute", "fill"])
def test_a_parametrized_module_is_never_split(balance: str) -> None:
    # past --max-memory, the orthogonal layer was split into its bias and its parametrization
    # (which computes the weight its own code reads with the bias): --verify of --balance fill
    # measured cuda:0's peak 46% over the plan, of compute 10%
    p = arch_plan(
        "cached_orthogonal",
        strategy="pipeline",
        balance=balance,
        assume="3x1GiB",
        max_memory=[1040] * 3,
    )
    assert "a" in p.units.paths
    assert not [u for u in p.units.paths if u.startswith("a.")]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
