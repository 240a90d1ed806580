"""bench as an ML engineer uses it, third round: language models in half precision.

Tried with models from pip libraries, built from configs (no downloads), and found to behave as
designed (not repeated here): ``bench model`` on transformers' BERT, GPT-2 and T5 encoders
(``--dtype int64``, outputs ``ModelOutput`` with a ``DynamicCache``), ViT, timm's ResNet-18 in
float32, channels_last and float16 on the CPU, diffusers' ``AutoencoderKL`` (a dataclass output);
diffusers' ``UNet2DModel`` (it needs a timestep) is a usage error that says to wrap it;
``--json``/``-o``/``--format`` and the exit codes; ``to_host`` on ``torch.return_types`` and on
an ``OrderedDict`` subclass.

Pinned here: GPT-2's output holds a ``DynamicCache``, a plain object keeping its keys and
values in ``cache.layers[i]``; D2H copied the logits only, though the docs say every tensor of
the output (a plain object, which cannot be rebuilt, now comes back as the list of its
tensors' host copies), and a model returning only such an object was refused as holding no
tensor. And a
language model cannot be timed on float inputs, so ``--dtype float16`` on GPT-2
failed with "give --dtype int64", which silently dropped the half precision asked for (an integer
``--dtype`` leaves the weights as built) and said nothing of how to keep it; and a run on token
ids reported only ``int64``, never the dtype the weights were timed in.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn

from torchplace.bench.render import stages_table
from torchplace.bench.stages import load_model_spec, run_stages, to_host
from torchplace.cli import main

HERE = "tests.bench.test_realworld3"

pytestmark = pytest.mark.filterwarnings("ignore::torchplace.bench.timer.TimingWarning")


class _TinyLM(nn.Module):
    """Token ids in, logits out, as a causal language model takes them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10)

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.head(self.embed(ids))}


class _Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys
        self.values = values


class _Cache:
    """Like transformers' ``DynamicCache``: no ``to``, tensors in a list of plain objects."""

    def __init__(self, *layers: _Layer) -> None:
        self.layers = list(layers)


class _CachingLM(_TinyLM):
    def forward(self, ids: torch.Tensor) -> Any:
        hidden = self.embed(ids)
        return {"logits": self.head(hidden), "cache": _Cache(_Layer(hidden, hidden * 2))}


class _OnlyCache(_TinyLM):
    def forward(self, ids: torch.Tensor) -> Any:
        return _Cache(_Layer(self.embed(ids), self.embed(ids)))


def make_caching_lm() -> nn.Module:
    return _CachingLM()


def make_only_cache() -> nn.Module:
    return _OnlyCache()


def make_lm() -> nn.Module:
    return _TinyLM()


def make_half_lm() -> nn.Module:
    return _TinyLM().to(torch.float16)


def _words(text: str) -> str:
    """``text`` with its line wrapping undone (a title wider than its table wraps)."""
    return " ".join(text.split())


def _bench(argv: list[str]) -> int:
    return main(["bench", "model", "--device", "cpu", "--min-time", "0.001", *argv])


def test_a_floating_dtype_on_a_language_model_says_how_to_keep_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--model", f"{HERE}:make_lm", "--input-shape", "5", "--batch-sizes", "2"]
    assert _bench([*argv, "--dtype", "float16"]) == 2
    err = capsys.readouterr().err
    assert "give --dtype int64" in err
    assert "for float16 weights, have the callable return model.to(torch.float16)" in err


def test_float32_inputs_to_a_language_model_need_only_the_integer_dtype(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--model", f"{HERE}:make_lm", "--input-shape", "5", "--batch-sizes", "2"]
    assert _bench([*argv, "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert "give --dtype int64" in err
    assert "model.to(" not in err


def test_token_ids_into_half_weights_report_both_dtypes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--model", f"{HERE}:make_half_lm", "--input-shape", "5", "--batch-sizes", "2"]
    assert _bench([*argv, "--dtype", "int64", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)["result"]["figures"]
    assert (figures["dtype"], figures["weights_dtype"]) == ("int64", "float16")


def test_the_table_title_names_both_dtypes_only_when_they_differ() -> None:
    cpu = torch.device("cpu")
    spec = load_model_spec(f"{HERE}:make_half_lm", "5")
    mixed = run_stages(spec, cpu, batch_sizes=(2,), dtype="int64", min_time=0.001, warmup=0)
    console = Console(width=200, record=True)
    console.print(stages_table(mixed))
    assert "(int64 inputs, float16 weights, row shape (5,))" in _words(console.export_text())

    same = run_stages(load_model_spec("seed-mlp"), cpu, batch_sizes=(2,), min_time=0.001, warmup=0)
    assert same.to_dict()["weights_dtype"] == "float32"
    console = Console(width=200, record=True)
    console.print(stages_table(same))
    assert "(float32, row shape (8,))" in _words(console.export_text())


def test_d2h_copies_the_tensors_a_cache_in_the_output_holds() -> None:
    hidden = torch.ones(2, 4)
    copied = to_host({"logits": torch.zeros(2, 10), "cache": _Cache(_Layer(hidden, hidden * 2))})
    assert torch.equal(copied["logits"], torch.zeros(2, 10))
    assert [tuple(t.shape) for t in copied["cache"]] == [(2, 4), (2, 4)]
    assert torch.equal(copied["cache"][1], hidden * 2)


@pytest.mark.parametrize("factory", ["make_caching_lm", "make_only_cache"])
def test_a_model_returning_a_cache_is_benchmarked(
    factory: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", f"{HERE}:{factory}", "--input-shape", "5", "--batch-sizes", "2"]
    assert _bench([*argv, "--dtype", "int64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["figures"]["batches"][0]["total_s"] > 0
