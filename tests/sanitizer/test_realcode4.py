"""The guard against a fourth round of real code: ``torch.amp`` (``GradScaler``), activation
checkpointing, parametrizations, complex numbers, ``torch.func`` transforms, a transformer's
KV cache, attention masks that place themselves (``CausalBias``) and a program that configures
its own logging under ``torchplace guard``.

Run against real programs, on the CPU, with the results compared with an unguarded run: a
Lightning 2.6 ``Trainer.fit`` (bf16-mixed autocast, torchmetrics, ``gradient_clip_val``,
``DataLoader`` workers), an accelerate 1.16 loop (bf16, gradient accumulation,
``clip_grad_norm_``, ``gather_for_metrics``), Hugging Face transformers 5 GPT-2 and Llama built
from small configs (``generate`` with a padding mask and greedy search, a training step),
``torch.compile`` in its default mode (a training loop and a compiled function), FSDP2
``fully_shard`` and DTensor on a one-process gloo group, fused ``AdamW`` with a cosine schedule,
quantized tensors, ``quantize_dynamic`` and torchao 0.18's ``quantize_`` (int8 weight-only,
dynamic int8), ``DataLoader`` workers started by fork and by spawn, a jagged nested tensor
through ``scaled_dot_product_attention``: all ran to the same results with no event, as on the
CPU nothing crosses, at 1.0x to 1.4x the time. On ``meta`` (standing
in for the accelerator): a Llama and a GPT-2 decode loop with a ``DynamicCache`` (the padding
mask checks of transformers' ``masking_utils`` are syncs), torchmetrics (its ``bincount``),
einops, ``weight_norm`` / ``spectral_norm`` / custom parametrizations, ``checkpoint_sequential``,
``vmap`` / ``jacrev`` / ``functional_call``, ``GradScaler`` with ``unscale_`` and
``clip_grad_norm_``, ``ReduceLROnPlateau``, a torchao int8 model moved with ``.to()``,
``nn.MultiheadAttention`` masks, distributions' argument validation, complex tensors and FFTs
reported what those programs do. The tests pin what was found, each with a small library-free
program.

``meta`` stands in for the accelerator; :class:`MetaReadback` makes up the data a real device
would hand back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import checkpoint

import torchplace
from torchplace.sanitizer import GuardReport

from .fakes import META, MetaReadback, line_of, site_rows

HERE = __file__
GUARD = [sys.executable, "-m", "torchplace.cli"]
REPORT_TITLE = "torchplace guard: device crossings"


def line(marker: str) -> int:
    return line_of(HERE, marker)


def _rows(report: GuardReport) -> list[tuple[str, int, int, int]]:
    return site_rows(report, HERE)


# ------------------------------------------------------------- a program's own logging setup

LOGGING_PROGRAM = textwrap.dedent(
    """\
    import logging
    # a library that adds its own handler only when the root logger has none (Lightning)
    print("root has handlers:", logging.getLogger().hasHandlers())
    logging.basicConfig(level=logging.INFO, format="PROGRAM %(name)s %(message)s")
    logging.getLogger("train").info("epoch 1")
    """
)


def _run(words: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # the torchplace under test, wherever the program runs from
    source = str(Path(torchplace.__file__).parents[1])
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(words, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def test_a_guarded_program_finds_the_root_logger_as_python_leaves_it(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(LOGGING_PROGRAM)
    plain = _run([sys.executable, "prog.py"], tmp_path)
    assert plain.stdout == "root has handlers: False\n"
    assert plain.stderr == "PROGRAM train epoch 1\n"
    for verbosity in ([], ["-v"]):
        guarded = _run([*GUARD, *verbosity, "guard", "--", "prog.py"], tmp_path)
        assert guarded.returncode == 0, guarded.stderr
        assert guarded.stdout == plain.stdout
        # the program's basicConfig took effect: its record, in its format, before the report
        assert guarded.stderr.index(plain.stderr) < guarded.stderr.index(REPORT_TITLE)


# ------------------------------------------------------------------------------- torch.amp


def test_grad_scaler_waits_once_per_step_for_its_found_inf_flags() -> None:
    model = nn.Linear(8, 4).to(META)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("meta")
    with MetaReadback(), torchplace.guard() as report:
        for _ in range(3):
            loss = model(torch.randn(2, 8, device=META)).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # unscales and checks on the device
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)  # scaler-step
            scaler.update()  # the new scale is computed on the device
            optimizer.zero_grad()
    # step() reads each device's found_inf with item() to decide whether to skip the step
    assert _rows(report) == [("sync", line("scaler-step"), 3, 0)]
    assert {e.op for e in report.events} == {"Tensor.item"}


# -------------------------------------------------------------------- checkpointing, params


def _block(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x) * torch.ones(8).to(x.device)  # copy-in-block


def test_a_copy_inside_a_checkpointed_block_is_made_again_by_the_recomputation() -> None:
    x = torch.randn(2, 8, device=META, requires_grad=True)
    for use_reentrant in (False, True):
        with MetaReadback(), torchplace.guard() as report:
            checkpoint(_block, x, use_reentrant=use_reentrant).sum().backward()
        # once in the forward, once when backward recomputes the block
        assert _rows(report) == [
            ("h2d", line("copy-in-block"), 2, 64),
            ("sync", line("copy-in-block"), 2, 0),
        ], use_reentrant


def _meta_runs_weight_norm_backward() -> bool:
    """Whether meta, the test's stand-in device, has a kernel for weight norm's backward
    (``_weight_norm_interface_backward``: torch 2.9 has none; 2.13 has one)."""
    normed = nn.utils.parametrizations.weight_norm(nn.Linear(2, 2)).to(META)
    try:
        normed(torch.randn(1, 2, device=META)).sum().backward()
    except NotImplementedError:
        return False
    return True


def test_parametrized_weights_are_computed_on_the_device() -> None:
    x = torch.randn(2, 8, device=META)
    normed = nn.utils.parametrizations.weight_norm(nn.Linear(8, 8)).to(META)
    spectral = nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8)).to(META)
    backward = _meta_runs_weight_norm_backward()
    with MetaReadback(), torchplace.guard("raise"):
        out = normed(x).sum()
        if backward:
            out.backward()
        spectral(x).sum().backward()  # a power iteration in training mode
        spectral.eval()
        spectral(x)
        with nn.utils.parametrize.cached():
            normed(x)


# -------------------------------------------------------------------- complex, torch.func


def test_complex_of_a_device_scalar_is_a_read_named_as_written() -> None:
    z = torch.ones((), dtype=torch.cfloat, device=META)
    with MetaReadback(), torchplace.guard() as report:
        complex(z)  # complex-read
        torch.fft.rfft(torch.randn(8, device=META)).abs()
        z * torch.tensor(1j)  # a CPU scalar: a value, not a crossing
    assert _rows(report) == [("sync", line("complex-read"), 1, 0)]
    assert [e.op for e in report.events] == ["Tensor.__complex__"]


def test_function_transforms_see_the_crossings_of_the_function_they_transform() -> None:
    from torch.func import functional_call, jacrev, vmap

    model = nn.Linear(3, 1).to(META)
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    xs = torch.randn(5, 3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        vmap(lambda x: functional_call(model, params, (x,)))(xs)
        jacrev(lambda x: (x**3).sum())(torch.randn(3, device=META))
        vmap(lambda x: x[torch.tensor([0, 2])])(xs)  # vmapped-cpu-index
    assert _rows(report) == [("mixed_device", line("vmapped-cpu-index"), 1, 0)]


# ------------------------------------------------------------------------------- KV cache


def test_an_empty_cache_made_with_torch_tensor_is_a_copy_of_nothing() -> None:
    keys = torch.randn(2, 1, 5, 4, device=META)
    with MetaReadback(), torchplace.guard() as report:
        cache = torch.tensor([], dtype=keys.dtype, device=keys.device)  # empty-cache
        for _ in range(3):  # the decode loop grows it on the device
            cache = keys if cache.numel() == 0 else torch.cat([cache, keys[:, :, -1:]], dim=-2)
    # torch copies nothing and so waits for nothing: a transfer of zero bytes, no sync
    assert _rows(report) == [("h2d", line("empty-cache"), 1, 0)]
    assert cache.shape == (2, 1, 7, 4)


# ------------------------------------------------------------- subclasses that place operands


def test_a_causal_bias_built_on_the_querys_device_is_no_mixed_device_op() -> None:
    from torch.nn.attention.bias import causal_lower_right

    query = torch.randn(2, 2, 3, 8, device=META)
    key = torch.randn(2, 2, 5, 8, device=META)
    bias = causal_lower_right(3, 5)  # claims the CPU; torch builds the mask on query's device
    assert bias.device.type == "cpu"
    with MetaReadback(), torchplace.guard("raise"):
        out = F.scaled_dot_product_attention(query, key, key, attn_mask=bias)
    assert out.device == META
    host_key = torch.randn(2, 2, 5, 8)
    with (
        MetaReadback(),
        torchplace.guard() as report,
        pytest.raises(ValueError, match="same device"),
    ):
        # a key really left on the host is still found: torch refuses it in Python, before any
        # aten op, and the guard names the operands of the call
        F.scaled_dot_product_attention(query, host_key, key, attn_mask=bias)  # host-key
    assert _rows(report) == [("mixed_device", line("host-key"), 1, 0)]
    operands = report.mixed_device_ops[0].operands
    assert [(o.name, o.device) for o in operands][:3] == [
        ("query", "meta"),
        ("key", "cpu"),
        ("value", "meta"),
    ]


class HostMask(torch.Tensor):
    """A mask kept on the host that moves itself to the device of the tensor it meets, in a
    comprehension (a frame of its own before Python 3.12)."""

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        devices = [a.device for a in args if type(a) is torch.Tensor]
        if not devices:  # nothing to meet (making the mask itself)
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        moved = [
            a.as_subclass(torch.Tensor).to(devices[0]) if isinstance(a, cls) else a for a in args
        ]
        return func(*moved, **(kwargs or {}))


class TreeMappedMask(HostMask):
    """The same, through ``tree_map`` and a lambda, as subclasses often write it."""

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        devices = [a.device for a in args if type(a) is torch.Tensor]
        if not devices:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        moved = tree_map(
            lambda a: a.as_subclass(torch.Tensor).to(devices[0]) if isinstance(a, cls) else a,
            list(args),
        )
        return func(*moved, **(kwargs or {}))


def _moved_mul(device: torch.device, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.mul(x, mask.as_subclass(torch.Tensor).to(device))


def _dispatch__torch_function__(
    cls: type[torch.Tensor],
    func: Any,
    types: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """A table of implementations behind a ``__torch_function__`` of another name, as torchao's
    quantized tensors (``TorchAOBaseTensor``) have it."""
    implementation = _IMPLEMENTATIONS.get(func)
    if implementation is None or type(args[0]) is not torch.Tensor:
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))
    return implementation(args[0].device, *args)


_IMPLEMENTATIONS: dict[Any, Any] = {torch.mul: _moved_mul}


class TableDispatchedMask(torch.Tensor):
    __torch_function__ = classmethod(_dispatch__torch_function__)


@pytest.mark.parametrize("kind", [HostMask, TreeMappedMask, TableDispatchedMask])
def test_a_subclass_that_moves_its_operands_is_reported_for_the_copy_it_makes(
    kind: type[torch.Tensor],
) -> None:
    x = torch.randn(4, device=META)
    mask = torch.ones(4).as_subclass(kind)
    with MetaReadback(), torchplace.guard() as report:
        out = torch.mul(x, mask)  # subclass-moves
    assert out.device == META
    # the copy the subclass makes, at the line that used it; no mixed-device op
    assert _rows(report) == [
        ("h2d", line("subclass-moves"), 1, 16),
        ("sync", line("subclass-moves"), 1, 0),
    ]
