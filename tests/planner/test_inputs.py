"""How the planner calls a model: declared inputs in order, by name those whose name is a
parameter elsewhere (keyword only, or another position)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.planner.conftest import toy_plan
from tests.planner.toy import KeywordOnly
from torchplace.errors import ConfigError
from torchplace.planner.inputs import call_arguments
from torchplace.planner.verify import verify


def test_an_input_taken_by_keyword_only_is_passed_by_its_name() -> None:
    x, mask = torch.zeros(2, 8), torch.ones(2, 8)
    args, kwargs = call_arguments(KeywordOnly(), [x, mask], ["x", "mask"])
    assert args == [x]
    assert kwargs == {"mask": mask}


def test_a_keyword_only_model_is_planned_and_verifies() -> None:
    p = toy_plan("make_keyword_only", strategy="pipeline")
    assert p.traces[2].flops == {"a": 2 * 2 * 8 * 8}
    assert verify(p, devices=["cpu"]).ok


class _Seq2Seq(torch.nn.Module):
    def forward(
        self, input_ids: Any, attention_mask: Any = None, decoder_input_ids: Any = None
    ) -> Any:
        return input_ids


class _Passthrough(torch.nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return args


class _Unnamed(torch.nn.Module):
    def forward(self, input: Any, other: Any = None) -> Any:
        return input


A, B = torch.zeros(1), torch.ones(1)


@pytest.mark.parametrize(
    ("module", "names", "want"),
    [
        # T5's decoder ids named past its attention mask: they went to attention_mask
        (_Seq2Seq(), ["input_ids", "decoder_input_ids"], ([A], {"decoder_input_ids": B})),
        (_Seq2Seq(), ["input_ids", "attention_mask"], ([A, B], {})),
        # in another order than the forward's: each by its name
        (_Seq2Seq(), ["attention_mask", "input_ids"], ([], {"attention_mask": A, "input_ids": B})),
        # names the forward does not know, and a forward that takes anything: in order
        (_Unnamed(), ["x", "mask"], ([A, B], {})),
        (_Passthrough(), ["x", "mask"], ([A, B], {})),
    ],
    ids=["past-a-parameter", "in-place", "reordered", "unknown-names", "var-positional"],
)
def test_inputs_named_as_forward_parameters_go_to_those(
    module: torch.nn.Module, names: list[str], want: tuple[list[Any], dict[str, Any]]
) -> None:
    args, kwargs = call_arguments(module, [A, B], names)
    assert (args, kwargs) == want


def test_a_lazy_model_is_refused_naming_its_uninitialized_parameters() -> None:
    # it said "cannot build the model ... the factory is called with no arguments and must
    # return a torch.nn.Module", which it did
    with pytest.raises(ConfigError, match="has uninitialized parameters") as info:
        toy_plan("make_lazy")
    assert "run one forward with a dummy batch in the factory" in str(info.value)
    assert "must return a torch.nn.Module" not in str(info.value)
