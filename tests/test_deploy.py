"""The deployment files (Dockerfile, deploy/ray) refer to things that exist.

Docker is not run here: this lints the Dockerfile's references (files it copies, extras it
installs, the torch pin, the entry point), and checks the Ray Serve files against the code.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from torchplace.serve.config import ServeConfig
from torchplace.serve.onray import RayOptions, app_settings

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_dockerfile_has_a_cpu_and_a_cuda_target() -> None:
    targets = [rest.split()[-1] for word, rest in _instructions() if word == "FROM"]
    assert targets == ["cpu", "cuda"]


def test_dockerfile_copies_files_that_exist() -> None:
    for word, rest in _instructions():
        if word == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"


def test_dockerfile_installs_extras_that_exist_and_the_pinned_torch() -> None:
    extras = set(_pyproject()["project"]["optional-dependencies"])
    args = dict(
        rest.split("=", 1) for word, rest in _instructions() if word == "ARG" and "=" in rest
    )
    assert set(args["EXTRAS"].split(",")) <= extras
    pin = (REPO / "constraints" / "ci.txt").read_text().split("torch==")[1].split()[0]
    assert args["TORCH_VERSION"] == pin
    assert "ray" in extras  # what the Ray image installs with EXTRAS=serve,ray


def test_dockerfile_entrypoint_is_the_project_script() -> None:
    entry = [rest for word, rest in _instructions() if word == "ENTRYPOINT"]
    scripts = _pyproject()["project"]["scripts"]
    assert entry
    for line in entry:
        found = re.fullmatch(r'\["(\w+)"\]', line)
        assert found is not None, f"ENTRYPOINT {line} is not an exec-form single program"
        assert found[1] in scripts


@pytest.mark.parametrize("path", ["deploy/ray/serve_config.yaml", "deploy/ray/rayservice.yaml"])
def test_ray_serve_files_name_a_real_builder_and_settings(path: str) -> None:
    data = yaml.safe_load((REPO / path).read_text())
    if data.get("kind") == "RayService":
        data = yaml.safe_load(data["spec"]["serveConfigV2"])
    (app,) = data["applications"]
    module, _, attr = app["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attr)
    assert callable(builder)
    known = set(ServeConfig.field_names()) | set(RayOptions.__dataclass_fields__)
    assert set(app["args"]) <= known
    # what the builder makes of them (Ray itself is not imported here: the Ray tests import
    # it once their cluster's environment is set)
    config, options = app_settings(app["args"])
    deployment = options.deployment_options(config)
    assert deployment["max_ongoing_requests"] >= 2 * config.max_batch_size
    assert deployment["ray_actor_options"]["num_gpus"] == app["args"]["gpus_per_replica"]
    assert deployment["max_replicas_per_node"] == app["args"]["max_replicas_per_node"]
