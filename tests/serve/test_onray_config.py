"""The configuration a Ray deployment sends its replicas (:mod:`torchplace.serve.onray`),
without a Ray cluster."""

from __future__ import annotations

from torchplace.models import TensorSpec
from torchplace.serve.config import ServeConfig
from torchplace.serve.onray import _plain


def test_declarations_reach_the_replicas_whole() -> None:
    """A reshape and an output's labels file travel with their declarations (they were dropped:
    a replica served the model without its reshape), and so does unbatched."""
    inputs = (TensorSpec("x", "FP32", (-1, 4), reshape=(2, 2)),)
    outputs = (TensorSpec("y", "FP32", (-1, 3), label_filename="labels.txt"),)
    config = ServeConfig(inputs=inputs, outputs=outputs, unbatched=True)
    again = ServeConfig.from_mapping(_plain(config), source="ray deployment")
    assert again.inputs == inputs
    assert again.outputs == outputs
    assert again.unbatched
