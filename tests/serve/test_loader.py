from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from torchplace.errors import ConfigError
from torchplace.models import TensorSpec, embedded_model
from torchplace.serve.loader import load_model
from torchplace.serve.replica import Replica

from .engine_helpers import Scale, save_exported

HELPERS = "tests.serve.engine_helpers"


def test_embedded_model_keeps_its_name_and_declarations() -> None:
    model = load_model("seed-mlp", version="7")
    assert (model.name, model.version) == ("seed-mlp", "7")
    assert model.inputs == embedded_model("seed-mlp").inputs
    assert model.outputs == embedded_model("seed-mlp").outputs
    assert model.weight_bytes == (8 * 16 + 16 + 16 * 2 + 2) * 4
    assert not model.module.training


def test_factory_declarations_come_from_the_returned_module() -> None:
    model = load_model(f"{HELPERS}:scale_factory")
    assert model.name == "tests.serve.engine_helpers-scale_factory"
    assert model.inputs == (TensorSpec("x", "FP32", (-1, 4)),)
    assert model.outputs == (TensorSpec("y", "FP32", (-1, 4)),)


def test_factory_declarations_may_sit_on_the_callable() -> None:
    model = load_model(f"{HELPERS}:declared_on_callable")
    assert model.inputs[0].name == "x"
    assert model.outputs[0].name == "y"


def test_explicit_declarations_win() -> None:
    spec_in = (TensorSpec("features", "FP32", (-1, 4)),)
    spec_out = (TensorSpec("scores", "FP32", (-1, 4)),)
    model = load_model(f"{HELPERS}:scale_factory", inputs=spec_in, outputs=spec_out)
    assert model.inputs == spec_in
    assert model.outputs == spec_out


def test_undeclared_factory_asks_for_declarations() -> None:
    with pytest.raises(ConfigError, match=r"declares no inputs.*--input"):
        load_model(f"{HELPERS}:undeclared_factory")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
        (f"{HELPERS}:missing", "has no attribute 'missing'"),
        (f"{HELPERS}:not_a_module", "returned object, not a torch.nn.Module"),
        (f"{HELPERS}:save_exported", r"cannot build the model .*: TypeError: .*no arguments"),
        ("not-a-model", "neither an embedded model"),
    ],
)
def test_bad_model_targets_are_config_errors(target: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_model(target)


def test_batch_dimension_must_be_declared_first() -> None:
    with pytest.raises(ConfigError, match="first dimension must be -1"):
        load_model("seed-mlp", inputs=(TensorSpec("input", "FP32", (8,)),))
    with pytest.raises(ConfigError, match="datatype 'BYTES'"):
        load_model("seed-mlp", inputs=(TensorSpec("input", "BYTES", (-1, 8)),))


def test_weights_load_through_load_checkpoint(tmp_path: Path) -> None:
    source = Scale()
    with torch.no_grad():
        source.weight.fill_(3.0)
    path = tmp_path / "scale.safetensors"
    save_file(source.state_dict(), str(path))
    model = load_model(f"{HELPERS}:scale_factory", weights=path)
    assert isinstance(model.module, Scale)
    assert torch.equal(model.module.weight, torch.full((4,), 3.0))


def test_exported_program_is_served_with_recorded_shapes(tmp_path: Path) -> None:
    host = embedded_model("seed-mlp").build()
    path = save_exported(tmp_path / "seed.pt2", host, torch.zeros(4, 8))
    model = load_model("seed-mlp", exported=path)
    assert model.name == "seed"
    assert model.inputs == (TensorSpec("input", "FP32", (-1, 8)),)
    assert model.outputs == (TensorSpec("output", "FP32", (-1, 2)),)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32))
    with torch.inference_mode():
        torch.testing.assert_close(model.module(x), host(x))


def test_missing_exported_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_model("seed-mlp", exported=tmp_path / "nope.pt2")


class _BurnsInItsDevice(torch.nn.Module):
    """Creates a tensor in forward: tracing records the export device in the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((4,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + torch.ones(4, device=x.device)


@pytest.mark.skipif(
    importlib.util.find_spec("torch.export.passes") is None,
    reason="torch < 2.6 cannot move the devices burnt into an exported graph",
)
def test_each_replica_of_an_exported_program_runs_on_its_own_device(tmp_path: Path) -> None:
    path = save_exported(tmp_path / "burnt.pt2", _BurnsInItsDevice(), torch.zeros(4, 4))
    model = load_model("burnt", exported=path)
    assert model.rebuild is not None
    # on `meta` (the second device here) the copy made for a replica creates its temporaries
    # there too: nothing in its graph still points at the CPU it was exported on
    on_meta = model.rebuild(torch.device("meta"))
    out = on_meta(torch.zeros(3, 4, device="meta"))
    assert out.device.type == "meta"
    assert all(t.device.type == "meta" for t in (*on_meta.parameters(), *on_meta.buffers()))
    replica = Replica(model, torch.device("cpu"), max_batch_size=4)
    replica.prepare()
    (result,) = replica.run_batch([{"input": np.ones((2, 4), np.float32)}], [2]).results
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["output"], np.full((2, 4), 3.0, np.float32))


def test_weights_reach_every_replica_of_an_exported_program(tmp_path: Path) -> None:
    path = save_exported(tmp_path / "scale.pt2", Scale(), torch.zeros(4, 4))
    trained = Scale()
    with torch.no_grad():
        trained.weight.fill_(5.0)
    weights = tmp_path / "trained.safetensors"
    save_file(trained.state_dict(), str(weights))
    model = load_model("scale", exported=path, weights=weights)
    replica = Replica(model, torch.device("cpu"), max_batch_size=4)
    replica.prepare()
    (result,) = replica.run_batch([{"input": np.ones((2, 4), np.float32)}], [2]).results
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["output"], np.full((2, 4), 5.0, np.float32))


@pytest.mark.cuda
def test_an_exported_program_exported_on_the_cpu_is_served_on_cuda(tmp_path: Path) -> None:
    path = save_exported(tmp_path / "burnt.pt2", _BurnsInItsDevice(), torch.zeros(4, 4))
    device = torch.device("cuda", 0)
    replica = Replica(load_model("burnt", exported=path), device, max_batch_size=8)
    replica.prepare()  # the dry run at 8 rows runs on the GPU, temporaries included
    assert replica.is_ready()
    assert replica.staging is not None
    assert replica.staging.is_pinned()
    (result,) = replica.run_batch([{"input": np.ones((2, 4), np.float32)}], [2]).results
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["output"], np.full((2, 4), 3.0, np.float32))


def _makes_a_range() -> torch.fx.GraphModule:
    """A graph that makes a tensor on the CPU, as export records ``device=x.device``."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    made = graph.call_function(torch.ops.aten.arange.default, (3,), {"device": torch.device("cpu")})
    graph.output(graph.call_function(torch.ops.aten.add.Tensor, (x, made)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("pass_moved_the_nodes", [False, True])
def test_a_subgraph_makes_its_tensors_on_the_device_the_program_moves_to(
    pass_moved_the_nodes: bool,
) -> None:
    # a higher-order operator's subgraph (wrap_with_autocast's submod_1): torch 2.9's
    # move_to_device_pass rewrote its nodes but not its code, which still made them on the CPU
    from torchplace.serve.loader import _move_burnt_in_devices

    root = torch.nn.Module()
    root.submod_1 = _makes_a_range()
    meta = torch.device("meta")
    if pass_moved_the_nodes:
        for node in root.submod_1.graph.nodes:
            if "device" in node.kwargs:
                node.update_kwarg("device", meta)  # the code is not regenerated
    _move_burnt_in_devices(root, meta)
    assert root.submod_1(torch.zeros(3, device=meta)).device == meta
