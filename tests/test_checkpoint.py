"""load_checkpoint: safe formats, any saved device onto any device, and loading into modules."""

from __future__ import annotations

import logging
import os
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.serialization
from safetensors.torch import save_file
from torch import nn

from torchplace import (
    CheckpointError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    load_checkpoint,
)
from torchplace.checkpoint import compare_state_dict


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))


def save_claiming(obj: Any, path: Path, location: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save ``obj`` with every storage tagged as living on ``location`` (e.g. cuda:1).

    This is exactly what a checkpoint saved on that GPU contains: the tensors' bytes plus a
    location tag per storage, which plain ``torch.load`` uses to restore them there.
    """
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: location)
        torch.save(obj, path)


def data_pickle(path: Path) -> bytes:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("data.pkl"))
        return z.read(name)


@pytest.fixture
def cuda1_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, dict[str, Any]]:
    state = model().state_dict()
    path = tmp_path / "saved_on_cuda1.pt"
    save_claiming(state, path, "cuda:1", monkeypatch)
    assert b"cuda:1" in data_pickle(path)
    return path, state


def test_checkpoint_saved_on_cuda1_loads_on_cpu(
    cuda1_checkpoint: tuple[Path, dict[str, Any]],
) -> None:
    path, state = cuda1_checkpoint
    if not torch.cuda.is_available():
        # the naive load fails here: the file really does claim a GPU (torch < 2.5 wraps the
        # error in an UnpicklingError)
        with pytest.raises((RuntimeError, pickle.UnpicklingError), match="CUDA"):
            torch.load(path, weights_only=True)
    loaded = load_checkpoint(path, "cpu")
    assert type(loaded) is dict
    assert list(loaded) == list(state)
    for k, v in state.items():
        assert loaded[k].device == torch.device("cpu")
        assert torch.equal(loaded[k], v)


def test_checkpoint_saved_on_cuda1_loads_on_meta(
    cuda1_checkpoint: tuple[Path, dict[str, Any]],
) -> None:
    path, state = cuda1_checkpoint
    loaded = load_checkpoint(path, "meta")
    assert all(t.device.type == "meta" for t in loaded.values())
    assert {k: v.shape for k, v in loaded.items()} == {k: v.shape for k, v in state.items()}


def test_checkpoint_saved_on_cuda1_loads_into_a_module(
    cuda1_checkpoint: tuple[Path, dict[str, Any]],
) -> None:
    path, state = cuda1_checkpoint
    target = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))
    load_checkpoint(path, "cpu", module=target)
    for k, v in target.state_dict().items():
        assert torch.equal(v, state[k])


def test_safetensors(tmp_path: Path) -> None:
    state = {k: v.contiguous() for k, v in model().state_dict().items()}
    path = tmp_path / "weights.safetensors"
    save_file(state, str(path))
    loaded = load_checkpoint(path)
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    # recognised by its header too, whatever the suffix
    other = tmp_path / "weights.bin"
    other.write_bytes(path.read_bytes())
    assert load_checkpoint(str(other)).keys() == state.keys()
    # a device safetensors cannot load onto directly
    on_meta = load_checkpoint(path, "meta")
    assert all(t.device.type == "meta" for t in on_meta.values())


def test_a_torch_save_file_named_safetensors_is_named_for_what_it_is(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    torch.save(model().state_dict(), path)  # a common slip: torch's format under that name
    with pytest.raises(CheckpointError, match=r"holds torch\.save's format.*rename it to \.pt"):
        load_checkpoint(path)


def test_a_lazy_module_takes_its_shapes_from_the_checkpoint(tmp_path: Path) -> None:
    """``nn.LazyLinear`` has no shapes before its first forward; torch's own loading gives its
    parameters the checkpoint's, so there is nothing to compare them with (it raised on the
    uninitialized parameter's shape)."""
    source = torch.nn.Linear(2, 3)
    torch.save(source.state_dict(), tmp_path / "m.pt")
    lazy = torch.nn.LazyLinear(3)
    load_checkpoint(tmp_path / "m.pt", module=lazy)
    assert torch.equal(lazy.weight, source.weight)
    assert torch.equal(lazy.bias, source.bias)
    with pytest.raises(StateDictMismatchError, match="weight"):  # a real mismatch still counts
        load_checkpoint(tmp_path / "m.pt", module=torch.nn.Linear(2, 4))


@pytest.mark.parametrize("key", ["state_dict", "model", "model_state_dict"])
def test_common_containers_are_unwrapped(tmp_path: Path, key: str) -> None:
    state = model().state_dict()
    path = tmp_path / "ckpt.pth"
    torch.save({key: state, "epoch": 3, "optimizer": {"lr": 0.1}}, path)
    loaded = load_checkpoint(path)
    assert list(loaded) == list(state)


def test_a_non_state_dict_is_refused_with_the_bad_entries(tmp_path: Path) -> None:
    path = tmp_path / "misc.pt"
    torch.save({"weights": [torch.ones(1)], "epoch": 3}, path)
    with pytest.raises(CheckpointError, match="'epoch' \\(int\\)"):
        load_checkpoint(path)
    torch.save([torch.ones(1)], path)
    with pytest.raises(CheckpointError, match="holds a list"):
        load_checkpoint(path)


class Config:
    """Anything torch.load(weights_only=True) does not know: loading it runs this module's code."""

    def __init__(self) -> None:
        self.lr = 0.1


class Exploit:
    """A pickle that runs code on load: it touches a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.marker),))


def test_pickle_needing_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"state_dict": model().state_dict(), "x": Exploit(str(marker))}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint(path)
    msg = str(info.value)
    assert str(path) in msg
    assert "allow_pickle=True" in msg
    assert "arbitrary code" in msg
    assert not marker.exists(), "the refused pickle ran code"


def test_allow_pickle_opts_in(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "trusted.pt"
    state = model().state_dict()
    torch.save({"state_dict": state, "config": Config()}, path)
    with pytest.raises(UnsafeCheckpointError, match="Config"):
        load_checkpoint(path)
    caplog.set_level(logging.WARNING, logger="torchplace.checkpoint")
    loaded = load_checkpoint(path, allow_pickle=True)
    assert list(loaded) == list(state)
    assert any("full pickle" in r.getMessage() for r in caplog.records)


def test_missing_and_broken_files_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match=r"nope\.pt"):
        load_checkpoint(missing)
    with pytest.raises(CheckpointError, match=r"is a directory without any of model\.safetensors"):
        load_checkpoint(tmp_path)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"hello, this is not a checkpoint")
    with pytest.raises(CheckpointError, match=r"garbage\.pt") as info:
        load_checkpoint(garbage)
    assert not isinstance(info.value, UnsafeCheckpointError)
    # A byte torch's weights-only unpickler reads as an unknown opcode is still just garbage:
    # the error must not send the user to allow_pickle=True.
    opcode = tmp_path / "opcode.pt"
    opcode.write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"opcode\.pt.*is it a torch checkpoint") as info:
        load_checkpoint(opcode)
    assert not isinstance(info.value, UnsafeCheckpointError)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match=r"broken\.safetensors"):
        load_checkpoint(broken)
    empty = tmp_path / "empty.pt"  # an interrupted save or download
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.pt' is empty \(0 bytes\)"):
        load_checkpoint(empty)


def test_a_file_torch_did_not_save_is_named_as_such_before_torch_reads_it(tmp_path: Path) -> None:
    text = tmp_path / "notes.pt"
    text.write_text("hello")  # torch.load would fail with "KeyError: 101"
    with pytest.raises(CheckpointError, match=r"notes\.pt': it is not a torch checkpoint"):
        load_checkpoint(text)


def test_a_zip_archive_cut_short_is_named_as_damaged(tmp_path: Path) -> None:
    path = tmp_path / "partial.pt"
    torch.save({"weight": torch.zeros(64, 64)}, path)
    path.write_bytes(path.read_bytes()[:1000])  # an interrupted download
    with pytest.raises(CheckpointError, match=r"partial\.pt': it starts as a zip archive"):
        load_checkpoint(path)


# a DeprecationWarning up to torch 2.13, a FutureWarning from 2.14 on
@pytest.mark.filterwarnings("ignore:`torch.jit.* is deprecated")
def test_a_torchscript_archive_is_refused_with_how_to_load_it(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), str(path))
    with pytest.raises(CheckpointError, match=r"TorchScript archive.*torch\.jit\.load") as info:
        load_checkpoint(path)
    assert not isinstance(info.value, UnsafeCheckpointError)
    # a state dict saved by torch.save is a zip archive too, and loads
    torch.save(torch.jit.load(str(path)).state_dict(), tmp_path / "weights.pt")
    assert set(load_checkpoint(tmp_path / "weights.pt")) == {"weight", "bias"}


def test_pathlike_and_device_objects(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save(model().state_dict(), path)
    assert load_checkpoint(os.fspath(path), torch.device("cpu"))
    assert load_checkpoint(path, "auto" if not torch.cuda.is_available() else "cpu")


class Wider(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 32)
        self.head = nn.Linear(32, 2)


class Narrow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.out = nn.Linear(16, 2)


def test_strict_mismatch_names_every_key_and_leaves_the_module_alone(tmp_path: Path) -> None:
    path = tmp_path / "narrow.pt"
    torch.save(Narrow().state_dict(), path)
    target = Wider()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(StateDictMismatchError) as info:
        load_checkpoint(path, module=target)
    msg = str(info.value)
    assert "missing from the checkpoint (2):\n  head.weight\n  head.bias" in msg
    assert "unexpected in the checkpoint (2):\n  out.weight\n  out.bias" in msg
    assert "fc.weight: checkpoint [16, 8] vs module [32, 8]" in msg
    assert "fc.bias: checkpoint [16] vs module [32]" in msg
    assert "strict=False" in msg
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def test_non_strict_loads_what_fits_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = Narrow()
    src.fc = nn.Linear(8, 32)  # fits Wider.fc now; "out" still does not fit anything
    path = tmp_path / "partial.pt"
    torch.save(src.state_dict(), path)
    target = Wider()
    caplog.set_level(logging.WARNING, logger="torchplace.checkpoint")
    state = load_checkpoint(path, module=target, strict=False)
    assert set(state) == {"fc.weight", "fc.bias", "out.weight", "out.bias"}
    assert torch.equal(target.fc.weight, src.fc.weight)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "head.weight" in text
    assert "out.bias" in text


def test_non_strict_skips_shape_mismatches_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "narrow.pt"
    torch.save(Narrow().state_dict(), path)
    target = Wider()
    load_checkpoint(path, module=target, strict=False)  # torch alone would raise on the shapes


def test_compare_state_dict() -> None:
    diff = compare_state_dict(Wider(), Narrow().state_dict())
    assert diff.missing == ("head.weight", "head.bias")
    assert diff.unexpected == ("out.weight", "out.bias")
    assert diff.mismatched == (("fc.weight", (16, 8), (32, 8)), ("fc.bias", (16,), (32,)))
    assert not diff.ok
    assert compare_state_dict(Wider(), OrderedDict(Wider().state_dict())).ok


@pytest.mark.cuda
def test_cuda_load_onto_the_gpu_from_any_saved_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    state = model().state_dict()
    path = tmp_path / "from_cuda7.pt"
    save_claiming(state, path, "cuda:7", monkeypatch)  # a GPU this machine does not have
    loaded = load_checkpoint(path, "cuda")
    assert all(t.device == dev for t in loaded.values())
    assert all(torch.equal(loaded[k].cpu(), v) for k, v in state.items())
    st = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(st))
    assert all(t.device == dev for t in load_checkpoint(st, dev).values())


@pytest.mark.cuda
def test_cuda_saved_checkpoint_loads_on_the_cpu(tmp_path: Path) -> None:
    # saved from real CUDA tensors (torch.save tags each storage 'cuda:0'), loaded on the CPU,
    # into a CPU module, and back onto the GPU
    dev = torch.device("cuda", torch.cuda.current_device())
    net = model().to(dev)
    state = net.state_dict()
    assert all(t.device == dev for t in state.values())
    path = tmp_path / "saved_on_gpu.pt"
    torch.save(state, path)
    assert f"cuda:{dev.index}".encode() in data_pickle(path)
    loaded = load_checkpoint(path, "cpu")
    assert all(t.device == torch.device("cpu") for t in loaded.values())
    assert all(torch.equal(loaded[k], v.cpu()) for k, v in state.items())
    target = model()
    load_checkpoint(path, "cpu", module=target)
    assert all(torch.equal(target.state_dict()[k], v.cpu()) for k, v in state.items())
    again = load_checkpoint(path, "cuda:0")
    assert all(t.device == torch.device("cuda", 0) for t in again.values())
    st = tmp_path / "saved_on_gpu.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(st))  # from GPU tensors
    on_cpu = load_checkpoint(st, "cpu")
    assert all(t.device == torch.device("cpu") for t in on_cpu.values())
    assert all(torch.equal(on_cpu[k], v.cpu()) for k, v in state.items())


def test_a_checkpoint_saved_from_meta_tensors_names_them_instead_of_crashing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "meta.pt"
    torch.save({k: v.to("meta") for k, v in model().state_dict().items()}, path)
    with pytest.raises(CheckpointError, match=r"without data.*0\.weight.*onto cpu.*to_empty"):
        load_checkpoint(path, "cpu")
    with pytest.raises(CheckpointError, match="without data"):
        load_checkpoint(path, "cpu", module=model())
    assert load_checkpoint(path, "meta")["0.weight"].is_meta  # shapes only: fine


def test_loading_onto_meta_into_a_module_with_data_leaves_it_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save(model().state_dict(), path)
    target = nn.Linear(8, 16)
    before = target.weight.detach().clone()
    with pytest.raises(CheckpointError, match=r"onto the meta device.*weight.*live on cpu"):
        load_checkpoint(path, "meta", module=nn.Sequential(target))
    assert torch.equal(target.weight, before)
    on_meta = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2)).to("meta")
    assert sorted(load_checkpoint(path, "meta", module=on_meta)) == sorted(model().state_dict())


def test_a_path_that_is_not_a_path_is_a_config_error(tmp_path: Path) -> None:
    from torchplace import ConfigError

    with pytest.raises(ConfigError, match="path 3 has type int"):
        load_checkpoint(3)  # type: ignore[arg-type]
    path = tmp_path / "ckpt.pt"
    torch.save(model().state_dict(), path)
    assert "0.weight" in load_checkpoint(os.fsencode(path))  # type: ignore[arg-type]
