"""What KServe passes to a serving runtime, turned into ``torchplace serve`` settings.

KServe starts the runtime's container with the arguments of its ``ClusterServingRuntime``
(templated per ``InferenceService``) and an environment; its storage initializer has already
downloaded ``STORAGE_URI`` into the model directory (``/mnt/models``) before the server starts.

==================  =============================================================================
``--model_name``    the name the model is served under (the InferenceService's name)
``--model_dir``     the model directory (or one model file): see :func:`model_dir_settings`
``--http_port``     the port (else ``PORT`` from the environment, else ``--port``)
==================  =============================================================================

A model directory holds one exported program (``*.pt2``), or weights (``*.safetensors``, or
``*.pt``/``*.pth`` loaded with ``weights_only=True``) plus, for weights, the architecture: an
optional ``torchplace.toml`` (any ``torchplace serve`` setting, e.g. ``model = "seed-mlp"``;
relative paths in it are relative to the directory). Both load through the same safe loader
as ``--weights``/``--exported``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchplace.errors import ConfigError
from torchplace.serve.config import ServeConfig, load_config_file

__all__ = [
    "CONFIG_NAME",
    "add_kserve_flags",
    "kserve_config",
    "model_dir_settings",
]

#: the optional settings file of a model directory
CONFIG_NAME = "torchplace.toml"
_EXPORTED = (".pt2",)
_WEIGHTS = (".safetensors", ".pt", ".pth")


def add_kserve_flags(kserve: argparse._ArgumentGroup) -> None:
    """The arguments KServe's runtime templates pass (underscored, as KServe spells them)."""
    kserve.add_argument(
        "--model_name",
        metavar="NAME",
        help="serve the model under NAME (KServe passes the InferenceService's name)",
    )
    kserve.add_argument(
        "--model_dir",
        metavar="DIR",
        help=f"a model directory: one .pt2, or weights (.safetensors/.pt) with an optional "
        f"{CONFIG_NAME} naming the model (KServe: /mnt/models)",
    )
    kserve.add_argument(
        "--http_port", type=int, metavar="PORT", help="the HTTP port (KServe: 8080; else $PORT)"
    )


def model_dir_settings(model_dir: Path) -> dict[str, Any]:
    """The settings a model directory gives: its ``torchplace.toml`` and the one model file."""
    if model_dir.is_file():
        return _file_setting(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(
            f"--model_dir {str(model_dir)!r} does not exist; give the directory KServe's storage "
            "initializer downloaded STORAGE_URI into (/mnt/models)"
        )
    settings: dict[str, Any] = {}
    config_file = model_dir / CONFIG_NAME
    if config_file.is_file():
        for key, value in load_config_file(config_file).items():
            key = str(key).replace("-", "_")
            if key in ("weights", "exported", "auth_token_file", "trace_file") and value:
                value = str(model_dir / str(value))
            settings[key] = value
    if "weights" in settings or "exported" in settings:
        return settings
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and not p.name.startswith("."))
    models = [p for p in files if p.suffix in _EXPORTED + _WEIGHTS]
    if len(models) != 1:
        found = ", ".join(str(p.relative_to(model_dir)) for p in models) or "none"
        storage = os.environ.get("STORAGE_URI")
        hint = f" (STORAGE_URI={storage!r} should have been downloaded there)" if storage else ""
        raise ConfigError(
            f"--model_dir {str(model_dir)!r} must hold exactly one model file (.pt2, "
            f".safetensors, .pt or .pth){hint}; found: {found}; or name it in "
            f"{CONFIG_NAME} (weights = 'FILE' or exported = 'FILE')"
        )
    settings.update(_file_setting(models[0]))
    return settings


def _file_setting(path: Path) -> dict[str, Any]:
    if path.suffix in _EXPORTED:
        return {"exported": str(path)}
    if path.suffix in _WEIGHTS:
        return {"weights": str(path)}
    raise ConfigError(
        f"model file {str(path)!r} is neither an exported program (.pt2) nor weights "
        "(.safetensors, .pt, .pth)"
    )


def kserve_config(
    args: argparse.Namespace, config: ServeConfig, env: Mapping[str, str] | None = None
) -> ServeConfig:
    """``config`` with what KServe passed applied: the model dir's settings under the flags
    given, then ``--http_port`` (or ``$PORT`` when no port flag was given)."""
    env = os.environ if env is None else env
    changes: dict[str, Any] = {}
    model_dir = getattr(args, "model_dir", None)
    if model_dir is not None:
        from_dir = model_dir_settings(Path(model_dir))
        given = {k for k in vars(args) if k in ServeConfig.field_names()}
        changes.update({k: v for k, v in from_dir.items() if k not in given})
    if getattr(args, "model_name", None) is not None:
        changes["name"] = args.model_name  # validated by ServeConfig like --name
    port = getattr(args, "http_port", None)
    if port is None and "port" not in vars(args) and env.get("PORT"):
        raw = env["PORT"]
        if not (raw.isascii() and raw.isdigit()):
            raise ConfigError(f"PORT={raw!r} in the environment is not a port number")
        port = int(raw)
    if port is not None:
        changes["port"] = port
    if not changes:
        return config
    if "weights" in changes or "exported" in changes:
        changes.setdefault("weights", None)
        changes.setdefault("exported", None)
    return config.with_overrides(changes, source="KServe arguments")
