"""Files and batches as real tools write them, reproduced in plain torch: a quantized model's state
dict, an optimizer's state dict, a torch.export archive, numpy arrays beside the weights, a
state dict with a stray non-tensor entry, quantized and nested tensors loaded onto ``meta``, and
``collections.UserList`` batches for move() and check_same_device()."""

from __future__ import annotations

import collections
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from torchplace import (
    CheckpointError,
    MixedDeviceError,
    PlacementError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    check_same_device,
    load_checkpoint,
    move,
)


def quantized(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated in torch 2.13
        return torch.ao.quantization.quantize_dynamic(
            nn.Sequential(nn.Linear(4, 3)), {nn.Linear}, dtype=torch.qint8
        )


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns of its own quantized code
def test_a_quantize_dynamic_state_dict_loads_into_its_module_by_its_version(
    tmp_path: Path,
) -> None:
    """Its packed weights are no tensors (``_packed_params``: a dtype and a tuple), and its
    ``_load_from_state_dict`` reads them by the module version torch.save kept in ``_metadata``:
    once refused as 'not a state dict', then a KeyError inside load_state_dict."""
    saved, into = quantized(), quantized(seed=1)
    assert not torch.equal(into(torch.ones(2, 4)), saved(torch.ones(2, 4)))
    torch.save(saved.state_dict(), tmp_path / "q.pt")
    load_checkpoint(tmp_path / "q.pt", module=into)
    x = torch.ones(2, 4)
    assert torch.equal(into(x), saved(x))


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns of its own quantized code
def test_a_ddp_wrapped_quantized_state_dict_keeps_its_versions_under_the_new_keys(
    tmp_path: Path,
) -> None:
    saved, into = quantized(), quantized(seed=1)
    state = saved.state_dict()
    wrapped = collections.OrderedDict((f"module.{k}", v) for k, v in state.items())
    wrapped._metadata = collections.OrderedDict(  # type: ignore[attr-defined]
        (f"module.{k}" if k else "module", v)
        for k, v in state._metadata.items()  # type: ignore[attr-defined]
    )
    torch.save({"state_dict": wrapped, "epoch": 3}, tmp_path / "ddp.pt")
    load_checkpoint(tmp_path / "ddp.pt", module=into)
    assert torch.equal(into(torch.ones(1, 4)), saved(torch.ones(1, 4)))


def test_an_optimizer_state_dict_is_named_as_one(tmp_path: Path) -> None:
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "optimizer.bin")  # as accelerate's save_state does
    with pytest.raises(CheckpointError, match=r"optimizer's state dict.*optimizer.load_state_dict"):
        load_checkpoint(tmp_path / "optimizer.bin")


def test_a_torch_export_archive_says_how_to_load_it(tmp_path: Path) -> None:
    program = torch.export.export(nn.Linear(2, 2), (torch.ones(1, 2),))
    torch.export.save(program, tmp_path / "model.pt2")
    with pytest.raises(CheckpointError, match=r"torch\.export archive.*torch\.export\.load"):
        load_checkpoint(tmp_path / "model.pt2")


def test_numpy_arrays_beside_the_weights_name_every_global_they_need(tmp_path: Path) -> None:
    """torch names only the first refused global; allowing it alone fails on the next."""
    np = pytest.importorskip("numpy")
    torch.save(
        {"state_dict": nn.Linear(2, 2).state_dict(), "mean": np.zeros(3)}, tmp_path / "np.pt"
    )
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint(tmp_path / "np.pt")
    message = str(info.value)
    assert "numpy.ndarray" in message
    assert "numpy.dtype" in message
    assert "_reconstruct" in message
    assert "add_safe_globals([" in message


def test_a_state_dict_with_a_stray_non_tensor_entry_names_it(tmp_path: Path) -> None:
    state = {**nn.Linear(2, 2).state_dict(), "version": 2}
    torch.save({"state_dict": state}, tmp_path / "mixed.pt")
    with pytest.raises(CheckpointError, match=r"entry 'state_dict'.*'version' \(int\)"):
        load_checkpoint(tmp_path / "mixed.pt")


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns of its own quantized code
def test_quantized_and_nested_tensors_onto_meta_say_to_load_onto_the_cpu(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    for name, value in (("q", q), ("nested", nested)):
        torch.save({"w": value}, tmp_path / f"{name}.pt")
        with pytest.raises(CheckpointError, match=r"onto meta.*load_checkpoint\(path, 'cpu'\)"):
            load_checkpoint(tmp_path / f"{name}.pt", "meta")
        assert load_checkpoint(tmp_path / f"{name}.pt")["w"].device.type == "cpu"


class Batch(collections.UserList):  # type: ignore[type-arg]
    pass


def test_a_userlist_batch_is_moved_not_passed_back_unmoved() -> None:
    batch = Batch([torch.ones(1), {"x": torch.ones(2)}])
    batch.tag = "kept"  # type: ignore[attr-defined]
    out = move(batch, "meta")
    assert type(out) is Batch
    assert out.tag == "kept"
    assert out[0].is_meta
    assert out[1]["x"].is_meta
    assert batch[0].device.type == "cpu"  # the original is untouched


def test_check_same_device_reads_a_userlist() -> None:
    with pytest.raises(MixedDeviceError, match=r"args\[0\]\[1\]"):
        check_same_device(collections.UserList([torch.ones(1), torch.ones(1, device="meta")]))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.layer = nn.Linear(4, 4)


class Classifier(nn.Module):
    """As a task model holds its base model (``BertForSequenceClassification.bert``)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.classifier = nn.Linear(4, 2)


def test_a_base_models_weights_load_into_the_model_that_holds_it(tmp_path: Path) -> None:
    """Every key fits under ``encoder.``: once all of them were 'unexpected' and strict=False
    loaded nothing at all."""
    torch.manual_seed(0)
    base = Encoder()
    torch.save(base.state_dict(), tmp_path / "base.pt")
    model = Classifier()
    with pytest.raises(StateDictMismatchError, match=r"missing.*\n  classifier\.weight") as info:
        load_checkpoint(tmp_path / "base.pt", module=model)
    assert "encoder.layer.weight" not in str(info.value)
    state = load_checkpoint(tmp_path / "base.pt", module=model, strict=False)
    assert set(state) == {f"encoder.{k}" for k in base.state_dict()}
    assert torch.equal(model.encoder.layer.weight, base.layer.weight)


def test_a_task_models_weights_load_into_its_base_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Classifier()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    base = Encoder()
    with pytest.raises(StateDictMismatchError, match=r"unexpected.*\n  classifier\.weight"):
        load_checkpoint(tmp_path / "model.pt", module=base)
    load_checkpoint(tmp_path / "model.pt", module=base, strict=False)
    assert torch.equal(base.embed.weight, model.encoder.embed.weight)


def test_a_prefix_that_fits_two_submodules_is_not_guessed(tmp_path: Path) -> None:
    class Twin(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "one.pt")
    with pytest.raises(
        StateDictMismatchError, match=r"(?s)missing.*a\.weight.*unexpected.*  weight"
    ):
        load_checkpoint(tmp_path / "one.pt", module=Twin())


def test_a_strided_nested_tensor_where_torch_has_no_kernels_is_a_placement_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(PlacementError, match=r"nested float32 tensor of 2 .*layout=torch\.jagged"):
        move({"n": nested}, "meta")
    jagged = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    assert move({"n": jagged}, "meta")["n"].is_meta
