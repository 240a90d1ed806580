"""Hostile-argument probes of the public Python API (``torchplace.__all__``).

Each test states the behaviour the project's standards ask for: bad input gets a clear error
from the ``TorchplaceError`` tree (or a conventional TypeError/ValueError naming the argument),
never an obscure internal exception, a silently wrong result or corrupted state.
"""

from __future__ import annotations

import collections
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchplace
from torchplace import (
    CheckpointError,
    ConfigError,
    DevicePrefetcher,
    MixedDeviceError,
    TorchplaceError,
    UnsafeCheckpointError,
    audit_module,
    check_same_device,
    guard,
    load_checkpoint,
    measure,
    move,
)

# ---------------------------------------------------------------------------------------------
# move
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["xla", "hpu"])
def test_move_to_a_torch_device_type_this_build_lacks_raises_a_torchplace_error(
    device: str,
) -> None:
    # torch.device("xla") / torch.device("hpu") parse, but the copy fails inside torch with a
    # bare RuntimeError ("not linked with support for xla devices") or ModuleNotFoundError
    # ("No module named 'torch.hpu'"); move promises the DeviceError of resolve_device instead.
    with pytest.raises(TorchplaceError, match=device):
        move(torch.zeros(2), device)


def test_move_keeps_a_counter_as_it_is() -> None:
    # dict subclasses are rebuilt with copy.copy(obj).update(new): Counter.update *adds*
    # counts, so every count came back doubled
    counts = collections.Counter(a=1, b=3)
    moved = move({"counts": counts, "x": torch.zeros(1)}, "meta")
    assert moved["counts"] == collections.Counter(a=1, b=3)
    assert counts == collections.Counter(a=1, b=3)


# ---------------------------------------------------------------------------------------------
# check_same_device / audit_module
# ---------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_check_same_device_with_a_lazy_module_reports_the_mismatch() -> None:
    # building the mismatch table reads the shape of the uninitialized parameter, and torch's
    # "Can't access the shape of an uninitialized parameter" RuntimeError replaces the
    # MixedDeviceError
    lazy = nn.LazyLinear(3)
    with pytest.raises(MixedDeviceError):
        check_same_device(model=lazy, x=torch.zeros(2, device="meta"))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_audit_module_of_a_lazy_module_does_not_crash() -> None:
    # TensorRecord.of reads t.shape of UninitializedParameter: a bare torch RuntimeError
    model = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2))
    try:
        audit = audit_module(model)
    except TorchplaceError:
        return  # a clear error of the project's tree is acceptable too
    assert "0.weight" in [r.name for r in audit.tensors]
    assert "1.weight" in [r.name for r in audit.tensors]
    str(audit)
    audit.to_json()


def test_audit_module_finds_strays_at_any_depth() -> None:
    # docs/core.md: "audit_module finds those strays at any depth"; a walk cut at depth 64
    # silently reports nothing for a stray nested deeper
    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            value: object = torch.zeros(1)
            for _ in range(80):
                value = [value]
            self.deep = value

    assert len(audit_module(Deep()).strays) == 1


# ---------------------------------------------------------------------------------------------
# load_checkpoint
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def linear_ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "ok.pt"
    torch.save(nn.Linear(2, 2).state_dict(), path)
    return path


@pytest.mark.parametrize("module", [5, {}, nn.Linear], ids=["int", "dict", "class"])
def test_load_checkpoint_rejects_a_module_that_is_not_an_nn_module(
    linear_ckpt: Path, module: object
) -> None:
    # was AttributeError: 'int' object has no attribute 'state_dict' (after loading the file)
    with pytest.raises((ConfigError, TypeError), match="module"):
        load_checkpoint(linear_ckpt, module=module)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_load_checkpoint_into_a_meta_module_does_not_silently_load_nothing(
    linear_ckpt: Path,
) -> None:
    # copying into meta parameters is a no-op: the call returned normally and the module was
    # still on meta, without any of the checkpoint's weights
    model = nn.Linear(2, 2).to("meta")
    try:
        state = load_checkpoint(linear_ckpt, "cpu", module=model)
    except TorchplaceError:
        assert model.weight.is_meta  # refused, and left untouched
        return
    assert not model.weight.is_meta
    assert torch.equal(model.weight.detach(), state["weight"])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_load_checkpoint_failure_inside_load_state_dict_leaves_the_module_untouched(
    tmp_path: Path,
) -> None:
    # a sparse tensor of the right shape passes the shape check, then copy_ fails in
    # load_state_dict: a bare RuntimeError, and "bias" was already overwritten
    path = tmp_path / "sparse.pt"
    torch.save({"weight": torch.eye(2).to_sparse(), "bias": torch.zeros(2)}, path)
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.bias.fill_(7.0)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with pytest.raises(TorchplaceError):
        load_checkpoint(path, module=model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.filterwarnings("ignore")
def test_load_checkpoint_does_not_advise_allow_pickle_for_a_plain_pickle(tmp_path: Path) -> None:
    # a pickle.dump file (not torch.save) is refused as "needs arbitrary code ... pass
    # allow_pickle=True", and allow_pickle=True then fails with "Invalid magic number": the
    # advice cannot help (checkpoint.py means never to give it then)
    path = tmp_path / "plain.pkl"
    with path.open("wb") as fh:
        pickle.dump({"weight": torch.zeros(2, 2)}, fh, protocol=4)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert not isinstance(info.value, UnsafeCheckpointError)
    assert "allow_pickle=True" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# measure / Timer
# ---------------------------------------------------------------------------------------------


def test_measure_with_a_huge_min_time_clamps_to_max_repeats() -> None:
    # min_time=1e308 passes validation, then math.ceil(min_time / per_call) overflows:
    # OverflowError: cannot convert float infinity to integer
    m = measure(
        lambda: None, device="cpu", warmup=1, min_time=1e308, max_repeats=3, spread_warning=None
    )
    assert m.count == 3


# ---------------------------------------------------------------------------------------------
# DevicePrefetcher
# ---------------------------------------------------------------------------------------------


def test_prefetcher_over_a_generator_that_raised_does_not_yield_an_empty_epoch() -> None:
    # docs/core.md: once a one-shot source is used up, the next iter() raises ConfigError
    # "instead of yielding an empty epoch"; a generator that died of an exception is used up,
    # yet the next pass silently yielded nothing
    def batches():  # type: ignore[no-untyped-def]
        yield torch.ones(1)
        raise ValueError("source failed")

    prefetcher = DevicePrefetcher(batches(), "meta")
    with pytest.raises(ValueError, match="source failed"):
        list(prefetcher)
    with pytest.raises(ConfigError):
        list(prefetcher)


# ---------------------------------------------------------------------------------------------
# guard
# ---------------------------------------------------------------------------------------------


def test_guard_rejects_max_events_none_clearly() -> None:
    # was TypeError: '<' not supported between instances of 'NoneType' and 'int'
    with pytest.raises((ConfigError, TypeError), match="max_events"):
        guard(max_events=None)  # type: ignore[arg-type]


def test_guard_rejects_a_non_iterable_allow_clearly() -> None:
    # was TypeError: 'int' object is not iterable (no mention of allow)
    with pytest.raises((ConfigError, TypeError), match="allow"):
        guard(allow=5)  # type: ignore[arg-type]


def test_guard_exit_without_enter_does_not_break_later_guards() -> None:
    # a stray __exit__ (never entered, or exited twice) raised torch's "trying to pop from
    # empty mode stack" RuntimeError and decremented the process-wide count of sync-wrapper
    # users below zero: every later guard stopped wrapping UntypedStorage.copy_ and
    # torch.cuda.synchronize, missing those crossings. Run in a subprocess: it corrupts the
    # process.
    code = textwrap.dedent(
        """
        import torch
        from torchplace import TorchplaceError, guard

        def storage_copies():
            with guard() as report:
                dst = torch.UntypedStorage(16, device="meta")
                dst.copy_(torch.UntypedStorage(16))
            return report.h2d

        assert storage_copies() == 1
        for stray in ("never entered", "exited twice"):
            g = guard()
            if stray == "exited twice":
                with g:
                    pass
            try:
                g.__exit__(None, None, None)
            except TorchplaceError:
                pass
            except Exception as exc:
                raise SystemExit(f"{stray}: {type(exc).__name__}: {exc}")
            got = storage_copies()
            if got != 1:
                raise SystemExit(f"after a guard {stray} was exited: {got} copies recorded")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "batch_sizes",
    [[1.5], [True], ["1"], [10**40], 5],
    ids=["float", "bool", "str", "overflow", "int"],
)
def test_plan_rejects_bad_batch_sizes_clearly(batch_sizes: object) -> None:
    # were torch's "empty(): argument 'size' ..." TypeErrors (with a C++ frame dump for
    # 10**40), "'<' not supported between 'str' and 'int'", "'int' object is not iterable"
    with pytest.raises((ConfigError, TypeError, ValueError), match="batch"):
        torchplace.plan(batch_sizes=batch_sizes)  # type: ignore[arg-type]


@pytest.mark.parametrize("seq", ["5", 1.5], ids=["str", "float"])
def test_plan_rejects_a_bad_seq_clearly(seq: object) -> None:
    with pytest.raises((ConfigError, TypeError, ValueError), match="seq"):
        torchplace.plan("gpt2-like", seq=seq)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"assume": 5}, {"devices": 5}, {"link": 5}, {"max_memory": 5}],
    ids=["assume", "devices", "link", "max_memory"],
)
def test_plan_rejects_non_string_hardware_arguments_clearly(kwargs: dict[str, object]) -> None:
    # were AttributeError: 'int' object has no attribute 'strip' / 'split' / 'lower', and
    # TypeError: object of type 'int' has no len()
    name = next(iter(kwargs)).replace("_", "[-_]")
    with pytest.raises((ConfigError, TypeError, ValueError), match=name):
        torchplace.plan(**kwargs)  # type: ignore[arg-type]


def test_plan_with_empty_devices_is_refused_like_empty_assume() -> None:
    # plan(assume="") raises ConfigError, but plan(devices="") silently planned the default
    # assumed 2xH200 instead of this machine's devices
    with pytest.raises(ConfigError):
        torchplace.plan(devices="")
