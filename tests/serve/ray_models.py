"""Models (and a span exporter) the Ray tests import in their replicas
(``tests.serve.ray_models:...``)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchplace.models import TensorSpec, build_model

#: a first input value that makes :func:`faulty_seed_mlp` raise a device error
POISON = 666.0


class _Faulty(nn.Module):
    torchplace_inputs = (TensorSpec("input", "FP32", (-1, 8)),)
    torchplace_outputs = (TensorSpec("output", "FP32", (-1, 2)),)

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_model("seed-mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a data-dependent branch is fine here: the test wants the host sync to see the value
        if bool((x[:, 0] == POISON).any()):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        out: torch.Tensor = self.inner(x)
        return out


def faulty_seed_mlp() -> nn.Module:
    """seed-mlp (same weights), except that a row starting with POISON raises a CUDA error."""
    return _Faulty().eval()


def span_exporter() -> list[Any]:
    """Ray Serve's tracing exporter in the Ray tests: each finished span (of the proxy and
    of every replica) as one JSON line in ``$TORCHPLACE_TEST_RAY_TMP/spans/PID.jsonl``."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    folder = Path(os.environ["TORCHPLACE_TEST_RAY_TMP"]) / "spans"
    folder.mkdir(exist_ok=True)
    path = folder / f"{os.getpid()}.jsonl"

    class _Lines(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            with path.open("a") as out:
                for span in spans:
                    parent = span.parent
                    out.write(
                        json.dumps(
                            {
                                "name": span.name,
                                "trace_id": f"{span.context.trace_id:032x}",
                                "span_id": f"{span.context.span_id:016x}",
                                "parent_id": f"{parent.span_id:016x}" if parent else None,
                                "start": span.start_time,
                                "end": span.end_time,
                            }
                        )
                        + "\n"
                    )
            return SpanExportResult.SUCCESS

    return [SimpleSpanProcessor(_Lines())]
