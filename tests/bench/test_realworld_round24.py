"""Round 24: ``bench model`` driven as a user sweeps batch sizes."""

from __future__ import annotations

import pytest
import torch

from torchplace.bench.stages import load_model_spec, run_stages
from torchplace.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::torchplace.bench.timer.TimingWarning")


def test_a_repeated_batch_size_is_refused_before_the_model_is_built() -> None:
    # `--batch-sizes 1,8,1` timed size 1 twice: its second row gave a warm call as the
    # model's first call at that size (compilation and autotuning seemingly gone)
    built: list[int] = []
    spec = load_model_spec("seed-mlp")
    build = spec.build

    def counted() -> torch.nn.Module:
        built.append(1)
        return build()

    object.__setattr__(spec, "build", counted)
    with pytest.raises(ConfigError, match=r"repeat 1: each size is timed once"):
        run_stages(spec, torch.device("cpu"), batch_sizes=(1, 8, 1), min_time=0.001, warmup=0)
    assert built == []
    rows = run_stages(spec, torch.device("cpu"), batch_sizes=(2, 1), min_time=0.001, warmup=0)
    assert [r.batch_size for r in rows.rows] == [2, 1]
