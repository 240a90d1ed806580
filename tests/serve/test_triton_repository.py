"""A Triton model repository served unchanged: ``config.pbtxt`` read as Triton's
``ModelConfig``, ``1/model.pt`` a TorchScript archive loaded with ``torch.jit.load``, other
backends refused per model, and state-dict ``.pt`` repositories served as before."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.errors import ConfigError
from torchplace.models import TensorSpec, build_model
from torchplace.serve.loader import load_model
from torchplace.serve.repository import Notices, read_model
from torchplace.serve.running import ServerThread
from torchplace.serve.torchscript import is_torchscript, tensor_order

from .conftest import test_config
from .repository_helpers import (
    X,
    call,
    expected,
    infer_body,
    scripted,
    triton_model,
    write_model,
)

# torch 2.13 deprecates TorchScript (DeprecationWarning; 2.14's FutureWarning is in pyproject)
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.[a-z_]+` is deprecated")
torch.manual_seed(0)


class Affine(nn.Module):
    """One input, one output: ``x @ W + b`` (4 features in, 3 out)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Pair(nn.Module):
    """Two inputs, two outputs: tells which input is which (``2a - b``, ``a * b``)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return 2 * a - b, a * b


AFFINE = """name: "affine"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { latest { num_versions: 1 } }
"""

# declared out of Triton's index order: INPUT__1 is the forward's second argument and
# OUTPUT__1 the second element of its tuple, wherever the config lists them
PAIR = """backend: "pytorch"
max_batch_size: 4
input [
  { name: "INPUT__1", data_type: TYPE_FP32, dims: [ 2 ] },
  { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 2 ] }
]
output [
  { name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 2 ] },
  { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 2 ] }
]
"""

# no outputs declared: the dry run infers them; the file under another name
NO_OUTPUTS = """platform: "pytorch_libtorch"
max_batch_size: 2
default_model_filename: "traced.pt"
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

ONNX = """platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

BAD = """platform: "pytorch_libtorch"
max_batch_sise: 8
"""


def free_port() -> int:
    """A free port in 19800-19999 (the range these tests may use)."""
    for port in range(19800, 20000):
        with contextlib.closing(socket.socket()) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 19800-19999")


# -- reading ------------------------------------------------------------------------------


def test_torchscript_archives_are_told_from_torch_save_files(tmp_path: Path) -> None:
    scripted(Affine(), tmp_path, "script.pt")
    pair = (torch.ones(1, 2), torch.ones(1, 2))
    torch.jit.save(torch.jit.trace(Pair(), pair), str(tmp_path / "traced.pt"))  # type: ignore[no-untyped-call]
    torch.save(Affine().state_dict(), tmp_path / "state.pt")
    torch.save(Affine(), tmp_path / "whole.pt")
    (tmp_path / "text.pt").write_text("not an archive")
    assert is_torchscript(tmp_path / "script.pt")
    assert is_torchscript(tmp_path / "traced.pt")
    for name in ("state.pt", "whole.pt", "text.pt", "missing.pt"):
        assert not is_torchscript(tmp_path / name), name


def test_triton_index_order() -> None:
    assert tensor_order(["INPUT__0", "INPUT__1"], inputs=True) is None
    assert tensor_order(["INPUT__1", "INPUT__0"], inputs=True) == (1, 0)
    assert tensor_order(["b__2", "a__0", "c__1"], inputs=True) == (1, 2, 0)
    assert tensor_order(["x", "y"], inputs=True) is None  # by order
    assert tensor_order(["INPUT__0", "INPUT__2"], inputs=True) is None
    assert tensor_order(["OUTPUT__1", "OUTPUT__0"], inputs=False) == (1, 0)
    assert tensor_order(["OUTPUT__1"], inputs=False) == (1,)


def test_config_pbtxt_is_read_as_triton_model_config(tmp_path: Path) -> None:
    triton_model(tmp_path, "affine", AFFINE, Affine())
    model = read_model(tmp_path, "affine")
    assert model.source == str(tmp_path / "affine" / "config.pbtxt")
    assert model.versions == ("1",)
    settings = model.version_settings("1")
    assert settings["torchscript"] == str(tmp_path / "affine" / "1" / "model.pt")
    assert settings["weights"] is None
    assert settings["exported"] is None
    assert settings["max_batch_size"] == 8
    assert settings["max_delay_ms"] == 0.5
    assert settings["replicas_per_device"] == 2
    assert settings["devices"] == ["cpu"]
    assert settings["inputs"] == [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, 4]}]
    assert settings["outputs"] == [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 3]}]


def test_default_model_filename_names_the_archive(tmp_path: Path) -> None:
    triton_model(tmp_path, "m", NO_OUTPUTS)
    scripted(Affine(), tmp_path / "m" / "1", "traced.pt")
    settings = read_model(tmp_path, "m").version_settings("1")
    assert settings["torchscript"] == str(tmp_path / "m" / "1" / "traced.pt")


def test_a_bad_config_pbtxt_names_the_file_the_line_and_the_fix(tmp_path: Path) -> None:
    triton_model(tmp_path, "bad", BAD, Affine())
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "bad")
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "bad" / "config.pbtxt"))
    assert "line 2" in message
    assert "max_batch_sise" in message
    assert "protobuf text format" in message


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ('platform: "onnxruntime_onnx"', "onnxruntime"),
        ('backend: "onnxruntime"', "onnxruntime"),
        ('platform: "tensorrt_plan"', "tensorrt"),
        ('backend: "python"', "python"),
        ('platform: "ensemble"', "ensemble"),
    ],
)
def test_other_backends_are_refused_by_name(tmp_path: Path, line: str, kind: str) -> None:
    triton_model(tmp_path, "m", f"{line}\nmax_batch_size: 8\n")
    (tmp_path / "m" / "1").mkdir()
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "m")
    message = str(caught.value)
    assert f"'m' is a Triton {kind} model" in message
    assert "torchplace serves PyTorch models" in message


def test_without_protobuf_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton_model(tmp_path, "affine", AFFINE, Affine())
    monkeypatch.setitem(sys.modules, "google.protobuf", None)  # not installed
    with pytest.raises(ConfigError, match=r"needs protobuf.*torchplace\[grpc\]"):
        read_model(tmp_path, "affine")


def test_the_python_runtime_of_the_pytorch_backend_is_refused(tmp_path: Path) -> None:
    triton_model(tmp_path, "m", 'backend: "pytorch"\nruntime: "model.py"\nmax_batch_size: 2\n')
    (tmp_path / "m" / "1").mkdir()
    with pytest.raises(ConfigError, match="Python runtime"):
        read_model(tmp_path, "m")


def test_a_torchscript_pt_of_a_config_toml_model_needs_no_source(tmp_path: Path) -> None:
    write_model(tmp_path, "m", config='inputs = ["x:FP32:-1,4"]\n', weights=False)
    scripted(Affine(), tmp_path / "m" / "1")
    settings = read_model(tmp_path, "m").version_settings("1")
    assert settings["torchscript"] == str(tmp_path / "m" / "1" / "model.pt")
    assert settings["weights"] is None
    loaded = load_model(torchscript=settings["torchscript"], name="m",
                        inputs=(TensorSpec("x", "FP32", (-1, 4)),))  # fmt: skip
    assert [spec.shape for spec in loaded.outputs] == [(-1, 3)]  # from the dry run


def test_a_parse_error_on_a_long_line_is_cut(tmp_path: Path) -> None:
    # protobuf quotes the whole token it stopped at: a 200,000-character line was the reason
    # the index answered and every log line repeated
    triton_model(tmp_path, "m", AFFINE + "instance_group " + "[" * 100_000 + "\n", Affine())
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "m")
    message = str(caught.value)
    assert "line 9" in message
    assert "characters)" in message
    assert len(message) < 1000


def test_label_filename_labels_the_output_that_names_it(tmp_path: Path) -> None:
    labelled = AFFINE.replace("dims: [ 3 ] }", 'dims: [ 3 ] label_filename: "labels.txt" }')
    triton_model(tmp_path, "affine", labelled, Affine())
    (tmp_path / "affine" / "labels.txt").write_text("cat\ndog\nbird\n")
    settings = read_model(tmp_path, "affine").version_settings("1")
    assert "labels" not in settings  # not the model's labels: the output's own
    (output,) = settings["outputs"]
    assert output["label_filename"] == str(tmp_path / "affine" / "labels.txt")
    loaded = load_model(torchscript=settings["torchscript"],
                        inputs=(TensorSpec("INPUT__0", "FP32", (-1, 4)),),
                        outputs=(TensorSpec("OUTPUT__0", "FP32", (-1, 3),
                                            label_filename=output["label_filename"]),))  # fmt: skip
    assert loaded.labels == {"OUTPUT__0": ("cat", "dog", "bird")}
    # outputs may name different files (Triton's labels are per output)
    two = PAIR.replace(
        '"OUTPUT__1", data_type: TYPE_FP32, dims: [ 2 ]',
        '"OUTPUT__1", data_type: TYPE_FP32, dims: [ 2 ], label_filename: "a"',
    )
    two = two.replace(
        '"OUTPUT__0", data_type: TYPE_FP32, dims: [ 2 ]',
        '"OUTPUT__0", data_type: TYPE_FP32, dims: [ 2 ], label_filename: "b"',
    )
    triton_model(tmp_path, "pair", two, Pair())
    outputs = read_model(tmp_path, "pair").settings["outputs"]
    assert [o["label_filename"] for o in outputs] == [
        str(tmp_path / "pair" / "a"),
        str(tmp_path / "pair" / "b"),
    ]


@pytest.mark.parametrize(
    ("tensor", "refused"),
    [
        ("dims: [ 4 ] reshape: { shape: [ 3 ] }", r"input 'INPUT__0' has different size"),
        ("dims: [ 4 ] reshape: { shape: [ 2, 2 ] }", [-1, 4]),  # applied: see test_triton_fidelity
        ("dims: [ 4 ] reshape: { shape: [ 4 ] }", [-1, 4]),  # the same shape: nothing to apply
        ("dims: [ -1 ]", [-1, -1]),  # a variable dimension (test_repository_variable_dims)
        ("dims: [ -2 ]", r"input\[0\]\.dims \[-2\] has a dimension below -1"),
    ],
)
def test_reshape_and_bad_dims_are_refused_in_triton_s_terms(
    tmp_path: Path, tensor: str, refused: str | list[int]
) -> None:
    # a reshape is checked against the dims as Triton checks it (and applied when it fits)
    triton_model(tmp_path, "affine", AFFINE.replace("dims: [ 4 ]", tensor), Affine())
    if isinstance(refused, list):
        assert read_model(tmp_path, "affine").settings["inputs"][0]["shape"] == refused
        return
    with pytest.raises(ConfigError, match=refused) as caught:
        read_model(tmp_path, "affine")
    assert str(caught.value).startswith(str(tmp_path / "affine" / "config.pbtxt"))


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (
            "instance_group [ { count: 2 kind: KIND_CPU } ]",
            "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] },"
            " { count: 1 kind: KIND_GPU gpus: [ 1 ] } ]",
        ),
        ('name: "affine"', 'name: "other"'),
        (
            "dynamic_batching { max_queue_delay_microseconds: 500 }",
            "dynamic_batching { priority_levels: 2000 }",
        ),
    ],
)
def test_a_config_pbtxt_s_mapping_errors_name_the_file_not_an_inline_config(
    tmp_path: Path, edit: str, problem: str
) -> None:
    # the mapping is an inline config's: its errors were made for one and cut afterwards
    triton_model(tmp_path, "affine", AFFINE.replace(edit, problem), Affine())
    with pytest.raises(ConfigError) as caught:
        read_model(tmp_path, "affine")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'affine' / 'config.pbtxt'}: "), message
    assert "inline config" not in message


def test_a_zip_bomb_archive_is_refused_before_torch_inflates_it(tmp_path: Path) -> None:
    # torch.jit.load inflates every entry whole: a deflated gigabyte of zeros in a 1 MB file
    # loaded (and held the gigabyte); torch.jit.save stores its entries uncompressed
    scripted(Affine(), tmp_path)
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in entries:
            archive.writestr(info, data)
        prefix = entries[0][0].filename.split("/")[0]
        archive.writestr(f"{prefix}/extra/zeros", b"\0" * (128 << 20), zipfile.ZIP_DEFLATED)
    assert is_torchscript(path)
    with pytest.raises(ConfigError, match=r"expands to 134,2.* over 16 times its size"):
        load_model(torchscript=path, inputs=(TensorSpec("x", "FP32", (-1, 4)),))


def test_a_torchscript_dry_run_error_names_the_model_not_seed_mlp(tmp_path: Path) -> None:
    class Total(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum()  # a scalar, not a batch

    scripted(Total(), tmp_path / "total")
    with pytest.raises(ConfigError, match="model 'model': output 'output' of its dry run"):
        load_model(torchscript=tmp_path / "total" / "model.pt",
                   inputs=(TensorSpec("x", "FP32", (-1, 4)),))  # fmt: skip
    with pytest.raises(ConfigError, match="model 'total': output 'output' of its dry run"):
        load_model(torchscript=tmp_path / "total" / "model.pt", name="total",
                   inputs=(TensorSpec("x", "FP32", (-1, 4)),))  # fmt: skip


def test_triton_no_batching_is_read_as_such_and_another_name_refused(tmp_path: Path) -> None:
    triton_model(tmp_path, "m", 'platform: "pytorch_libtorch"\n', Affine())
    settings = read_model(tmp_path, "m").settings  # max_batch_size left out: Triton's 0
    assert (settings["unbatched"], settings["max_batch_size"]) == (True, 1)
    (tmp_path / "m" / "config.pbtxt").write_text('name: "other"\nmax_batch_size: 2\n')
    with pytest.raises(ConfigError, match="unexpected directory name 'm' for model 'other'"):
        read_model(tmp_path, "m")


def test_config_toml_wins_over_config_pbtxt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, "m")  # seed-mlp's config.toml and weights
    (tmp_path / "m" / "config.pbtxt").write_text(ONNX)
    with caplog.at_level(logging.WARNING, logger="torchplace.serve.repository"):
        model = read_model(tmp_path, "m")
    assert model.source == str(tmp_path / "m" / "config.toml")
    assert model.version_settings("1")["model"] == "seed-mlp"
    assert "config.toml is read, config.pbtxt is not" in caplog.text


def test_the_both_configs_warning_is_told_once_per_directory_of_a_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a server's ModelControl holds one Notices: its poll every second does not repeat the
    # warning; the state is the reader's, not the module's (another server tells it again)
    write_model(tmp_path, "m")
    (tmp_path / "m" / "config.pbtxt").write_text(ONNX)
    notices = Notices()
    with caplog.at_level(logging.WARNING, logger="torchplace.serve.repository"):
        for _ in range(3):
            read_model(tmp_path, "m", notices=notices)
        assert caplog.text.count("config.toml is read, config.pbtxt is not") == 1
        read_model(tmp_path, "m", notices=Notices())
        assert caplog.text.count("config.toml is read, config.pbtxt is not") == 2


def test_each_pt_file_is_read_once_to_tell_archives_from_state_dicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchplace.serve import torchscript

    write_model(tmp_path, "m", config='inputs = ["x:FP32:-1,4"]\n[version_policy]\nall = true\n',
                weights=False)  # fmt: skip
    scripted(Affine(), tmp_path / "m" / "1")
    (tmp_path / "m" / "2").mkdir()
    torch.save(Affine().state_dict(), tmp_path / "m" / "2" / "model.pt")
    read: list[Path] = []
    real = torchscript.is_torchscript
    monkeypatch.setattr(torchscript, "is_torchscript", lambda p: read.append(p) or real(p))
    model = read_model(tmp_path, "m")
    one, two = (model.version_settings(v) for v in ("1", "2"))
    assert sorted(read) == [tmp_path / "m" / "1" / "model.pt", tmp_path / "m" / "2" / "model.pt"]
    assert (one["torchscript"], one["weights"]) == (str(tmp_path / "m" / "1" / "model.pt"), None)
    assert (two["torchscript"], two["weights"]) == (None, str(tmp_path / "m" / "2" / "model.pt"))


def test_a_state_dict_pt_is_still_weights(tmp_path: Path) -> None:
    write_model(tmp_path, "m", weights=False)
    torch.save(build_model("seed-mlp").state_dict(), tmp_path / "m" / "1" / "model.pt")
    settings = read_model(tmp_path, "m").version_settings("1")
    assert settings["weights"] == str(tmp_path / "m" / "1" / "model.pt")
    assert settings["torchscript"] is None


def test_a_state_dict_where_triton_wants_torchscript_says_so(tmp_path: Path) -> None:
    triton_model(tmp_path, "m", AFFINE.replace('"affine"', '"m"'))
    (tmp_path / "m" / "1").mkdir()
    torch.save(Affine().state_dict(), tmp_path / "m" / "1" / "model.pt")
    settings = read_model(tmp_path, "m").version_settings("1")
    with pytest.raises(ConfigError, match=r"is a torch\.save file .* not a TorchScript archive"):
        load_model(torchscript=settings["torchscript"], name="m")


def test_the_loader_serves_the_archive_in_tritons_order(tmp_path: Path) -> None:
    reference = scripted(Pair(), tmp_path / "pair" / "1")
    triton_model(tmp_path, "pair", PAIR)
    settings = read_model(tmp_path, "pair").version_settings("1")
    config = test_config(model_repository=tmp_path).with_overrides(settings)
    from torchplace.serve.loader import load_configured

    loaded = load_configured(config)
    assert loaded.source.startswith("torchscript:")
    a, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[10.0, 20.0]])
    one, two = loaded.module(b, a)  # the config's order: INPUT__1, INPUT__0
    want = reference(a, b)
    torch.testing.assert_close(one, want[1])  # OUTPUT__1
    torch.testing.assert_close(two, want[0])  # OUTPUT__0


# -- serving ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, nn.Module]]:
    root = tmp_path_factory.mktemp("triton-models")
    refs = {
        "affine": scripted(Affine(), root / "affine" / "1"),
        "pair": scripted(Pair(), root / "pair" / "1"),
        "noout": scripted(Affine(), root / "noout" / "1", "traced.pt"),
    }
    for name, text in (("affine", AFFINE), ("pair", PAIR), ("noout", NO_OUTPUTS)):
        (root / name / "config.pbtxt").write_text(text)
    triton_model(root, "onnx", ONNX)
    (root / "onnx" / "1").mkdir()
    (root / "onnx" / "1" / "model.onnx").write_bytes(b"onnx")
    triton_model(root, "bad", BAD, Affine())
    write_model(root, "seed", weights=False)  # a state-dict .pt repository, as before
    state = {k: 2 * t for k, t in build_model("seed-mlp").state_dict().items()}
    torch.save(state, root / "seed" / "1" / "model.pt")
    return root, refs


@pytest.fixture(scope="module")
def server(repository: tuple[Path, dict[str, nn.Module]]) -> Iterator[ServerThread]:
    config = test_config(
        device="cpu", model_repository=repository[0], port=free_port(), grpc_port=0
    )
    with ServerThread(config) as thread:
        yield thread


def infer(port: int, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    body = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
            for n, x in inputs.items()
        ]
    }
    status, answer = call(port, "POST", f"/v2/models/{model}/infer", orjson.dumps(body))
    assert status == 200, answer
    return {
        out["name"]: np.asarray(out["data"], np.float32).reshape(out["shape"])
        for out in answer["outputs"]
    }


def test_the_index_lists_the_triton_models(server: ServerThread) -> None:
    _, index = call(server.port, "POST", "/v2/repository/index", b"{}")
    states = {entry["name"]: entry for entry in index}
    for name in ("affine", "pair", "noout", "seed"):
        assert states[name]["state"] == "READY", states[name]
    assert states["onnx"]["state"] == "UNAVAILABLE"
    assert "'onnx' is a Triton onnxruntime model" in states["onnx"]["reason"]
    assert "torchplace serves PyTorch models" in states["onnx"]["reason"]
    assert states["bad"]["state"] == "UNAVAILABLE"
    assert "config.pbtxt: line 2" in states["bad"]["reason"]


def test_the_config_reflects_the_pbtxt(server: ServerThread) -> None:
    status, doc = call(server.port, "GET", "/v2/models/affine/config")
    assert status == 200, doc
    assert doc["max_batch_size"] == 8
    assert doc["input"] == [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [4]}]
    assert doc["output"] == [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [3]}]
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert doc["instance_group"][0]["count"] == 2
    assert doc["instance_group"][0]["kind"] == "KIND_CPU"


def test_infer_answers_as_the_torchscript_module(
    server: ServerThread, repository: tuple[Path, dict[str, nn.Module]]
) -> None:
    refs = repository[1]
    x = np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4)
    got = infer(server.port, "affine", {"INPUT__0": x})
    with torch.no_grad():
        want = refs["affine"](torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got["OUTPUT__0"], want, rtol=1e-5, atol=1e-6)
    got = infer(server.port, "noout", {"x": x})  # outputs inferred by the dry run
    with torch.no_grad():
        want = refs["noout"](torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got["output"], want, rtol=1e-5, atol=1e-6)


def test_two_inputs_go_by_tritons_index(
    server: ServerThread, repository: tuple[Path, dict[str, nn.Module]]
) -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = np.array([[10.0, 20.0], [30.0, 40.0]], np.float32)
    got = infer(server.port, "pair", {"INPUT__0": a, "INPUT__1": b})
    with torch.no_grad():
        first, second = repository[1]["pair"](torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_allclose(got["OUTPUT__0"], first.numpy())  # 2a - b
    np.testing.assert_allclose(got["OUTPUT__1"], second.numpy())  # a * b


def test_a_state_dict_pt_repository_serves_as_before(server: ServerThread) -> None:
    status, answer = call(server.port, "POST", "/v2/models/seed/infer",
                          orjson.dumps(infer_body()))  # fmt: skip
    assert status == 200, answer
    got = np.asarray(answer["outputs"][0]["data"], np.float32).reshape(1, 2)
    np.testing.assert_allclose(got, expected(2.0, X), rtol=1e-5)


def test_tritonclient_drives_it_as_triton(
    server: ServerThread, repository: tuple[Path, dict[str, nn.Module]]
) -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert client.is_model_ready("affine")
        assert not client.is_model_ready("onnx")
        config = client.get_model_config("affine")
        assert config["max_batch_size"] == 8
        x = np.ones((2, 4), np.float32)
        entry = httpclient.InferInput("INPUT__0", [2, 4], "FP32")
        entry.set_data_from_numpy(x)
        result = client.infer("affine", [entry],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT__0")])  # fmt: skip
        with torch.no_grad():
            want = repository[1]["affine"](torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), want, rtol=1e-5, atol=1e-6)
    finally:
        client.close()


def test_a_torchscript_archive_is_served_from_the_command_line(tmp_path: Path) -> None:
    """``--torchscript FILE.pt --input ...``: the archive alone, served under its file's stem;
    without ``--input`` the error says how to declare what the archive does not record."""
    import argparse

    from torchplace.serve.cli import config_from_args, configure
    from torchplace.serve.loader import load_configured

    reference = scripted(build_model("seed-mlp"), tmp_path, "scorer.pt")
    parser = argparse.ArgumentParser()
    configure(parser)
    path = str(tmp_path / "scorer.pt")
    args = parser.parse_args(["--torchscript", path, "--input", "input:FP32:-1,8"])
    loaded = load_configured(config_from_args(args))
    assert (loaded.name, loaded.source) == ("scorer", f"torchscript:{path}")
    x = torch.rand(3, 8)
    torch.testing.assert_close(loaded.module(x), reference(x))
    with pytest.raises(ConfigError, match=r"declare them: --input INPUT__0:FP32:-1,8"):
        load_configured(config_from_args(parser.parse_args(["--torchscript", path])))


QUEUED = """platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching {
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { max_queue_size: 100 default_timeout_microseconds: 5000 }
  priority_queue_policy { key: 1 value { max_queue_size: 10 } }
}
"""


def test_a_pbtxt_queue_is_the_engine_s(tmp_path: Path) -> None:
    """The queue a config.pbtxt gives (levels, limits, the default timeout) is the one the
    model's engine keeps, and its /config says so again."""
    from torchplace.serve.engine import Engine
    from torchplace.serve.triton import model_config

    triton_model(tmp_path, "queued", QUEUED, Affine())
    settings = read_model(tmp_path, "queued").version_settings("1")
    # built, not started: nothing is placed on a device
    engine = Engine.from_config(test_config(model_repository=tmp_path).with_overrides(settings))
    policy = engine.policy
    assert (policy.max_queue, policy.priority_levels, policy.default_priority) == (100, 2, 2)
    assert (policy.limits, policy.default_timeout_s) == ((10, 100), 0.005)
    batching = model_config(engine)["dynamic_batching"]
    assert batching["priority_queue_policy"]["1"]["max_queue_size"] == 10
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5000
