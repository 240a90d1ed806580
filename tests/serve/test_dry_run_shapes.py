"""The shape the start-up dry runs give an input with variable dimensions (``dry_run_shapes``,
``--dry-run-shape``, Triton's ``model_warmup``): a model that cannot take a size of 1 there
loads, and the shape is checked against the declaration."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.errors import ConfigError
from torchplace.serve import cli
from torchplace.serve.loader import load_model
from torchplace.serve.repository import read_model
from torchplace.serve.running import ServerThread
from torchplace.serve.triton_config import pbtxt_settings

from .conftest import Client, test_config


def _parse(*argv: str) -> object:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return cli.config_from_args(parser.parse_args(list(argv)))


SOURCE = "tests.serve.test_dry_run_shapes:build"
IMAGE = "image:FP32:-1,3,-1,-1"


def build() -> nn.Module:
    """Images of any size of at least 3x3 (an unpadded 3x3 convolution) to 4 scores."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4))


def _load(shapes: dict[str, tuple[int, ...]] | None) -> object:
    return load_model(SOURCE, inputs=(_spec(IMAGE),), dry_run_shapes=shapes)


def _spec(text: str) -> object:
    from torchplace.serve.config import parse_tensor_spec

    return parse_tensor_spec(text)


def test_a_model_that_cannot_take_size_1_loads_with_its_dry_run_shape() -> None:
    with pytest.raises(ConfigError, match="dry run on zeros failed"):
        _load(None)  # 1x1 images: the convolution has nothing to slide over
    loaded = _load({"image": (3, 8, 8)})
    assert [(s.name, s.shape) for s in loaded.outputs] == [("output", (-1, 4))]  # type: ignore[attr-defined]
    assert loaded.dry_row(loaded.inputs[0]) == (3, 8, 8)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("shapes", "words"),
    [
        ({"pixels": (3, 8, 8)}, "names input 'pixels', which model"),
        ({"image": (3, 8)}, "rows of shape [3, 8], but it is declared [3, -1, -1]"),
        ({"image": (1, 8, 8)}, "rows of shape [1, 8, 8], but it is declared [3, -1, -1]"),
    ],
)
def test_a_dry_run_shape_that_does_not_fit_the_declaration_is_refused(
    shapes: dict[str, tuple[int, ...]], words: str
) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        _load(shapes)


def test_the_flag_and_a_file_give_the_shapes_and_bad_ones_are_refused(tmp_path: Path) -> None:
    config = _parse("--model", SOURCE, "--input", IMAGE, "--dry-run-shape", "image:3,16, 16")
    assert config.dry_run_shapes == {"image": (3, 16, 16)}  # type: ignore[attr-defined]
    assert test_config(dry_run_shapes={"image": [3, 4, 4]}).dry_run_shapes == {"image": (3, 4, 4)}
    for bad, words in (
        (["image"], "is not NAME:DIMS"),
        (["image:3,x,4"], "is not a row shape of sizes >= 1"),
        (["image:3,0,4"], "is not a row shape of sizes >= 1"),
    ):
        with pytest.raises(ConfigError, match=words):
            _parse("--model", SOURCE, *(f"--dry-run-shape={b}" for b in bad))
    with pytest.raises(ConfigError, match="is not a row shape"):
        test_config(dry_run_shapes={"image": "3,4,4"})


def test_a_repository_model_takes_its_shapes_from_config_toml_or_model_warmup(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "images"
    (folder / "1").mkdir(parents=True)
    (folder / "config.toml").write_text(
        f'source = "{SOURCE}"\ninputs = ["{IMAGE}"]\ndry_run_shapes = {{ image = [3, 5, 5] }}\n'
    )
    model = read_model(tmp_path, "images")
    assert model.settings["dry_run_shapes"] == {"image": [3, 5, 5]}
    pbtxt = tmp_path / "triton"
    (pbtxt / "1").mkdir(parents=True)
    (pbtxt / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [{ name: "INPUT__0", data_type: TYPE_FP32, dims: [3, -1, -1] }]\n'
        'output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [4] }]\n'
        'model_warmup [{ name: "w" batch_size: 1 inputs { key: "INPUT__0" value: {'
        " data_type: TYPE_FP32 dims: [3, 224, 224] zero_data: true } } }]\n"
    )
    assert pbtxt_settings(pbtxt / "config.pbtxt", "triton")["dry_run_shapes"] == {
        "INPUT__0": [3, 224, 224]
    }


def test_a_server_serves_the_model_at_other_sizes(tmp_path: Path) -> None:
    config = test_config(model=SOURCE, inputs=(IMAGE,), dry_run_shapes={"image": [3, 6, 6]},
                         device="cpu", max_delay_ms=0.0)  # fmt: skip
    with ServerThread(config) as thread:
        client = Client("127.0.0.1", thread.port)
        reference = build().eval()
        for size in (3, 17):
            x = np.random.default_rng(size).random((1, 3, size, size), dtype=np.float32)
            request = {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.ravel().tolist()}]}  # fmt: skip
            status, _, raw = client.post(
                "/v2/models/tests.serve.test_dry_run_shapes-build/infer", orjson.dumps(request)
            )
            assert status == 200, raw
            body = orjson.loads(raw)
            with torch.inference_mode():
                want = reference(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(np.asarray(body["outputs"][0]["data"]), want.ravel(),
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
