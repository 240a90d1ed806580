"""load_checkpoint on checkpoints as real projects save them: training dicts, wrapper prefixes,
EMA copies, sharded safetensors, tied weights, half-precision files, legacy and .bin formats."""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file, save_model
from torch import nn

from torchplace import (
    CheckpointError,
    ConfigError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    load_checkpoint,
)
from torchplace.checkpoint import compare_state_dict


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))


def other_net() -> nn.Sequential:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def prefixed(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {prefix + k: v for k, v in state.items()}


def test_a_lightning_checkpoint_loads_its_state_dict(tmp_path: Path) -> None:
    src = net()
    opt = torch.optim.SGD(src.parameters(), lr=0.1, momentum=0.9)
    path = tmp_path / "epoch=3.ckpt"
    torch.save(
        {
            "state_dict": src.state_dict(),
            "epoch": 3,
            "global_step": 120,
            "optimizer_states": [opt.state_dict()],
            "lr_schedulers": [],
            "hyper_parameters": {"lr": 0.1},
        },
        path,
    )
    dst = other_net()
    load_checkpoint(path, module=dst)
    assert same_weights(src, dst)


def test_an_argparse_namespace_in_a_training_checkpoint_is_no_reason_to_refuse(
    tmp_path: Path,
) -> None:
    src = net()
    path = tmp_path / "checkpoint_best.pt"
    torch.save({"model": src.state_dict(), "args": argparse.Namespace(lr=0.1, arch="x")}, path)
    dst = other_net()
    load_checkpoint(path, module=dst)
    assert same_weights(src, dst)


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_wrapper_prefixes_are_stripped_when_the_module_lacks_them(
    tmp_path: Path, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    src = net()
    path = tmp_path / "ddp.pt"
    torch.save(prefixed(src.state_dict(), prefix), path)
    dst = other_net()
    caplog.set_level(logging.INFO, logger="torchplace.checkpoint")
    state = load_checkpoint(path, module=dst)
    assert same_weights(src, dst)
    assert sorted(state) == sorted(src.state_dict())  # the keys as loaded
    assert any(prefix.split(".")[0] in r.getMessage() for r in caplog.records)


def test_a_wrapper_prefix_is_stripped_with_strict_false_and_extra_keys(tmp_path: Path) -> None:
    src = net()
    path = tmp_path / "ddp_extra.pt"
    torch.save(prefixed({**src.state_dict(), "aux.weight": torch.zeros(2)}, "module."), path)
    dst = other_net()
    load_checkpoint(path, module=dst, strict=False)
    assert same_weights(src, dst)


def test_a_wrapped_module_takes_an_unwrapped_checkpoint(tmp_path: Path) -> None:
    src = net()
    path = tmp_path / "plain.pt"
    torch.save(src.state_dict(), path)
    dst = nn.DataParallel(other_net())  # keys "module.0.weight", ...
    load_checkpoint(path, module=dst)
    assert same_weights(src, dst.module)


def test_a_prefix_the_module_has_is_kept(tmp_path: Path) -> None:
    src = nn.DataParallel(net())
    path = tmp_path / "dp.pt"
    torch.save(src.state_dict(), path)
    dst = nn.DataParallel(other_net())
    state = load_checkpoint(path, module=dst)
    assert all(k.startswith("module.") for k in state)
    assert same_weights(src, dst)


def test_no_module_no_renaming(tmp_path: Path) -> None:
    path = tmp_path / "ddp.pt"
    torch.save(prefixed(net().state_dict(), "module."), path)
    assert all(k.startswith("module.") for k in load_checkpoint(path))


def test_a_lightning_attribute_prefix_is_stripped_when_the_rest_fits(tmp_path: Path) -> None:
    src = net()
    path = tmp_path / "lit.ckpt"
    torch.save({"state_dict": prefixed(src.state_dict(), "model."), "epoch": 1}, path)
    dst = other_net()
    load_checkpoint(path, module=dst)
    assert same_weights(src, dst)


def test_an_unknown_prefix_that_does_not_fit_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "lit.ckpt"
    state = prefixed({**net().state_dict(), "head.weight": torch.zeros(1)}, "model.")
    torch.save(state, path)
    with pytest.raises(
        StateDictMismatchError, match=r"Every key in the checkpoint starts with .model\.."
    ):
        load_checkpoint(path, module=other_net())


def test_ema_weights_under_their_own_key_are_found(tmp_path: Path) -> None:
    src = net()
    path = tmp_path / "ema_only.pt"
    torch.save({"state_dict_ema": src.state_dict(), "epoch": 9}, path)
    dst = other_net()
    load_checkpoint(path, module=dst)
    assert same_weights(src, dst)


def test_key_picks_the_ema_copy_over_the_model(tmp_path: Path) -> None:
    live, ema = net(), other_net()
    path = tmp_path / "train.pt"
    torch.save({"model": live.state_dict(), "model_ema": ema.state_dict(), "epoch": 9}, path)
    dst = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    load_checkpoint(path, module=dst)
    assert same_weights(live, dst)  # "model" is the default
    load_checkpoint(path, module=dst, key="model_ema")
    assert same_weights(ema, dst)


def test_several_unknown_state_dicts_are_named_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "two.pt"
    torch.save({"ema": net().state_dict(), "swa": net().state_dict(), "epoch": 1}, path)
    with pytest.raises(CheckpointError, match=r"'ema'.*'swa'.*key="):
        load_checkpoint(path)


def test_an_unknown_key_names_the_ones_there(tmp_path: Path) -> None:
    path = tmp_path / "train.pt"
    torch.save({"model": net().state_dict(), "epoch": 1}, path)
    with pytest.raises(CheckpointError, match=r"'ema'.*'model'"):
        load_checkpoint(path, key="ema")


def test_a_sharded_safetensors_checkpoint_loads_from_its_index(tmp_path: Path) -> None:
    src = net()
    state = src.state_dict()
    keys = list(state)
    shards = {
        "model-00001-of-00002.safetensors": {k: state[k] for k in keys[:3]},
        "model-00002-of-00002.safetensors": {k: state[k] for k in keys[3:]},
    }
    weight_map = {}
    for name, part in shards.items():
        save_file(part, tmp_path / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    dst = other_net()
    load_checkpoint(index, module=dst)
    assert same_weights(src, dst)
    dst2 = other_net()
    load_checkpoint(tmp_path, module=dst2)  # the directory save_pretrained writes
    assert same_weights(src, dst2)


def test_an_index_naming_a_missing_shard_names_it(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-00001-of-00009.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"model-00001-of-00009\.safetensors"):
        load_checkpoint(index)


def test_a_json_file_that_is_no_index_says_so(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4}))
    with pytest.raises(CheckpointError, match=r"weight_map"):
        load_checkpoint(path)


def test_a_directory_without_weights_names_what_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_checkpoint(tmp_path)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.emb.weight


def test_tied_weights_saved_once_load(tmp_path: Path) -> None:
    src = Tied()
    path = tmp_path / "tied.safetensors"
    save_model(src, str(path))  # save_file refuses shared tensors; save_model keeps one name
    dst = Tied()
    state = load_checkpoint(path, module=dst)
    assert torch.equal(dst.emb.weight, src.emb.weight)
    assert dst.head.weight is dst.emb.weight
    assert sorted(state) == ["emb.weight", "head.weight"]
    assert compare_state_dict(Tied(), {"emb.weight": src.emb.weight.detach()}).ok


def test_half_precision_weights_load_into_a_float32_module(tmp_path: Path) -> None:
    src = net()
    path = tmp_path / "half.safetensors"
    half = {
        k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in src.state_dict().items()
    }
    save_file(half, path)
    dst = other_net()
    state = load_checkpoint(path, module=dst)
    assert state["0.weight"].dtype == torch.bfloat16  # as saved
    assert dst.state_dict()["0.weight"].dtype == torch.float32  # the module keeps its dtype
    assert torch.equal(dst.state_dict()["0.weight"], half["0.weight"].float())


@pytest.mark.parametrize("name", ["pytorch_model.bin", "legacy.pt"])
def test_bin_and_legacy_torch_files(tmp_path: Path, name: str) -> None:
    src = net()
    path = tmp_path / name
    torch.save(src.state_dict(), path, _use_new_zipfile_serialization=name != "legacy.pt")
    dst = other_net()
    load_checkpoint(path, module=dst)
    assert same_weights(src, dst)


class Hparams:
    """A config object saved beside the weights, as training scripts do."""

    def __init__(self) -> None:
        self.lr = 0.1


def test_an_unknown_class_names_the_allow_list_fix_and_the_fix_works(tmp_path: Path) -> None:
    src = net()
    path = tmp_path / "with_hparams.pt"
    torch.save({"state_dict": src.state_dict(), "hparams": Hparams()}, path)
    with pytest.raises(UnsafeCheckpointError, match=r"add_safe_globals\(\[.*Hparams\]\)"):
        load_checkpoint(path)
    dst = other_net()
    with torch.serialization.safe_globals([Hparams]):
        load_checkpoint(path, module=dst)
    assert same_weights(src, dst)


def test_a_shard_of_a_sharded_checkpoint_is_still_checked_by_name(tmp_path: Path) -> None:
    state = net().state_dict()
    path = tmp_path / "model-00001-of-00002.safetensors"
    save_file({k: state[k] for k in list(state)[:3]}, path)
    with pytest.raises(
        StateDictMismatchError,
        match=r"(?s)missing from the checkpoint \(4\).*one shard of 2: load the index",
    ):
        load_checkpoint(path, module=other_net())


def test_a_bad_key_type_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    torch.save(net().state_dict(), path)
    with pytest.raises(ConfigError, match=r"key=3"):
        load_checkpoint(path, key=3)  # type: ignore[arg-type]


def test_an_unstrippable_prefix_is_named_in_the_non_strict_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "lit.ckpt"
    torch.save(prefixed({**net().state_dict(), "head.weight": torch.zeros(1)}, "model."), path)
    caplog.set_level(logging.WARNING, logger="torchplace.checkpoint")
    load_checkpoint(path, module=other_net(), strict=False)
    assert "starts with 'model.'" in caplog.text


def test_a_ddp_training_checkpoint_saved_on_cuda1_loads_into_a_cpu_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = net()
    path = tmp_path / "last.ckpt"
    saved = {"state_dict": prefixed(src.state_dict(), "module."), "epoch": 2}
    with monkeypatch.context() as m:  # every storage tagged as on cuda:1, as a GPU run saves it
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:1")
        torch.save(saved, path)
    dst = other_net()
    state = load_checkpoint(path, "cpu", module=dst)
    assert {v.device.type for v in state.values()} == {"cpu"}
    assert same_weights(src, dst)


def test_a_path_the_filesystem_refuses_is_a_checkpoint_error(tmp_path: Path) -> None:
    too_long = tmp_path / ("a" * 5000)  # ENAMETOOLONG from stat(), not "does not exist"
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*name too long"):
        load_checkpoint(too_long)


class WithExtraState(nn.Module):
    """A module with extra state (as TransformerEngine layers keep their FP8 metadata)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.calls = 0

    def get_extra_state(self) -> dict[str, int]:
        return {"calls": self.calls}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.calls = state["calls"]


def test_a_state_dict_with_extra_state_round_trips(tmp_path: Path) -> None:
    saved = WithExtraState()
    saved.calls = 7
    torch.save({"model": saved.state_dict(), "epoch": 2}, tmp_path / "extra.pt")
    into = WithExtraState()
    state = load_checkpoint(tmp_path / "extra.pt", "cpu", module=into)
    assert sorted(state) == ["_extra_state", "lin.bias", "lin.weight"]
    assert into.calls == 7
    assert torch.equal(into.lin.weight, saved.lin.weight)


def test_a_whole_pickled_module_loads_as_its_state_dict_when_trusted(tmp_path: Path) -> None:
    torch.save(net(), tmp_path / "whole.pt")
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(tmp_path / "whole.pt")
    into = other_net()
    state = load_checkpoint(tmp_path / "whole.pt", module=into, allow_pickle=True)
    assert sorted(state) == sorted(net().state_dict())
    assert same_weights(into, net())


# ------------------------------------------------- nested wrapper prefixes (model.module., ...)


@pytest.mark.parametrize(
    "prefix",
    [
        "model.module.",
        "model._orig_mod.",
        "_orig_mod.model.",
        "model.module._orig_mod.",
        "net.module.",
    ],  # any attribute a training wrapper holds the model under
)
def test_a_nested_wrapper_prefix_is_stripped_when_every_key_then_fits(
    tmp_path: Path, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # was: StateDictMismatchError: a DataParallel model saved inside a wrapper
    # (model.module.0.weight) lost neither prefix, "module." not being first and "model."
    # leaving keys that do not fit
    src = net()
    path = tmp_path / "wrapped.ckpt"
    torch.save({"state_dict": prefixed(src.state_dict(), prefix)}, path)
    dst = other_net()
    caplog.set_level(logging.INFO, logger="torchplace.checkpoint")
    state = load_checkpoint(path, module=dst)
    assert same_weights(src, dst)
    assert sorted(state) == sorted(src.state_dict())  # the keys as loaded
    assert f"stripped the {prefix!r} prefix of every key" in caplog.text


def test_a_nested_prefix_into_a_wrapped_module_loses_only_the_outer_part(tmp_path: Path) -> None:
    src = net()
    path = tmp_path / "wrapped.ckpt"
    torch.save(prefixed(src.state_dict(), "model.module."), path)
    dst = nn.DataParallel(other_net())  # keys "module.0.weight", ...
    state = load_checkpoint(path, module=dst)
    assert same_weights(src, dst.module)
    assert all(k.startswith("module.") for k in state)


def test_a_nested_prefix_is_kept_when_the_keys_would_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "wrapped.ckpt"
    state = prefixed({**net().state_dict(), "head.weight": torch.zeros(1)}, "model.module.")
    torch.save(state, path)
    dst = other_net()
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(StateDictMismatchError, match=r"starts with .model\.."):
        load_checkpoint(path, module=dst)
    assert all(torch.equal(before[k], v) for k, v in dst.state_dict().items())


def test_old_weight_norm_keys_load_under_a_nested_prefix(tmp_path: Path) -> None:
    def conv_wn(new: bool) -> nn.Module:
        conv = nn.Conv1d(2, 3, 3)
        if new:
            wrapped: nn.Module = nn.utils.parametrizations.weight_norm(conv)
            return wrapped
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return nn.utils.weight_norm(conv)

    saved = nn.Sequential(conv_wn(False), nn.Linear(1, 1)).state_dict()
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": prefixed(saved, "model.module.")}, path)
    model = nn.Sequential(conv_wn(True), nn.Linear(1, 1))
    load_checkpoint(path, module=model)
    loaded = model.state_dict()
    assert torch.equal(loaded["0.parametrizations.weight.original0"], saved["0.weight_g"])
    assert torch.equal(loaded["0.parametrizations.weight.original1"], saved["0.weight_v"])
    assert torch.equal(loaded["1.weight"], saved["1.weight"])
