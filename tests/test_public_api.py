from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import torchplace
from torchplace import errors

SRC = Path(torchplace.__file__).parent


def test_all_is_exactly_the_public_surface() -> None:
    # Submodules become attributes once imported; they are reachable but not the facade.
    public = {
        name
        for name in dir(torchplace)
        if not name.startswith("_") and not isinstance(getattr(torchplace, name), ModuleType)
    }
    assert public | {"__version__"} == set(torchplace.__all__)
    assert torchplace.__all__ == sorted(torchplace.__all__)


def test_every_public_name_resolves() -> None:
    for name in torchplace.__all__:
        assert getattr(torchplace, name) is not None, name


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        torchplace.no_such_thing  # type: ignore[attr-defined]  # noqa: B018


def test_every_error_derives_from_the_root() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.TorchplaceError), name


def test_serve_errors_carry_http_status() -> None:
    assert errors.InputError.status == 400
    assert errors.PayloadTooLargeError.status == 413
    assert errors.UnsupportedMediaTypeError.status == 415
    assert errors.OverloadedError.status == 503
    assert errors.NotReadyError.status == 503
    assert errors.DeviceOutOfMemoryError.status == 507
    assert errors.KernelError.status == errors.TransferError.status == 500


def test_import_has_no_side_effects_and_does_not_import_torch() -> None:
    code = "import sys, torchplace; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert out.stderr == ""


def test_py_typed_marker_ships() -> None:
    assert (SRC / "py.typed").exists()


def test_every_module_declares_all() -> None:
    missing = []
    for path in SRC.rglob("*.py"):
        if path.name == "__main__.py" or (path.name.startswith("_") and path.name != "__init__.py"):
            continue
        tree = ast.parse(path.read_text())
        names = {
            target.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        }
        body_is_empty = not [n for n in tree.body if not isinstance(n, ast.Expr)]
        if "__all__" not in names and not body_is_empty:
            missing.append(str(path.relative_to(SRC)))
    assert missing == [], f"modules without __all__: {missing}"


def test_all_matches_the_lazy_export_table() -> None:
    exports = torchplace._EXPORTS  # type: ignore[attr-defined]
    assert set(torchplace.__all__) == {*exports, "__version__"}
