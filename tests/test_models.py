from __future__ import annotations

import pytest
import torch

from torchplace.errors import ConfigError
from torchplace.models import EMBEDDED_MODELS, build_model, embedded_model


def test_seed_mlp_is_the_articles_model() -> None:
    model = build_model("seed-mlp")
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(16, 8), (16,), (2, 16), (2,)]
    assert not model.training


def test_wide_mlp_shapes() -> None:
    model = build_model("wide-mlp")
    weights = [tuple(p.shape) for n, p in model.named_parameters() if n.endswith("weight")]
    assert weights == [(2048, 512), (2048, 2048), (512, 2048)]
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 2


def test_weights_are_deterministic_and_leave_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("seed-mlp")
    b = build_model("seed-mlp")
    after = torch.rand(1)
    assert torch.equal(before, after)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("name", sorted(EMBEDDED_MODELS))
def test_declared_shapes_match_forward(name: str) -> None:
    spec = embedded_model(name)
    model = spec.build()
    (inp,), (out,) = spec.inputs, spec.outputs
    x = torch.randn(3, *inp.shape[1:])
    y = model(x)
    assert tuple(y.shape) == (3, *out.shape[1:])


def test_unknown_model_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="seed-mlp"):
        embedded_model("nope")
