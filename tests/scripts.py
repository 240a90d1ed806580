"""Loading a script of benchmarks/ (not a package) as a module, for tests of its helpers."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str, *, module_name: str | None = None) -> ModuleType:
    """``benchmarks/NAME.py`` as a module, registered in ``sys.modules`` under ``module_name``
    (dataclasses look their module up while being built); :func:`unload` removes it."""
    spec = importlib.util.spec_from_file_location(module_name or name, BENCHMARKS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(spec.name, None)
        raise
    return module


def unload(module: ModuleType) -> None:
    """Forget a module :func:`load_benchmark` registered."""
    sys.modules.pop(module.__name__, None)


def benchmark_fixture(name: str) -> Any:
    """A module-scoped fixture ``bench``: ``benchmarks/NAME.py`` loaded as a module for the
    tests of one file (``bench = benchmark_fixture("serve_profile")``), unloaded after them."""

    @pytest.fixture(scope="module", name="bench")
    def fixture() -> Iterator[ModuleType]:
        module = load_benchmark(name, module_name=f"{name}_under_test")
        yield module
        unload(module)

    return fixture


def usage_error(
    parse: Callable[[list[str]], object], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    """What ``parse(argv)`` says on standard error as it exits with status 2 (argparse's usage
    error), for tests of a benchmark's arguments."""
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err
