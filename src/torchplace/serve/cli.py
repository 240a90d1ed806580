"""Serve a model over the Open Inference Protocol (KServe v2 REST) on 127.0.0.1:8000 by default.

Every flag is also a setting of a ``--config`` file (TOML or JSON); flags given
on the command line override the file. With no arguments, ``torchplace serve`` serves the
embedded ``seed-mlp`` model on http://127.0.0.1:8000. SIGTERM or Ctrl-C drains: readiness
turns false, new requests get 503, in-flight ones finish, then the process exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

from torchplace import report
from torchplace.errors import ConfigError
from torchplace.serve.config import LOG_LEVELS, MIB, ServeConfig
from torchplace.serve.datatypes import SERVING_DTYPES
from torchplace.serve.kserve import add_kserve_flags, kserve_config
from torchplace.serve.ray_cli import add_ray_flags, check_ray_flags, run_on_ray
from torchplace.serve.tracing import TRACE_FORMATS

__all__ = ["config_from_args", "configure", "run"]

_D = ServeConfig()  # the defaults, shown in --help


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare ``torchplace serve``'s flags (one per ServeConfig field, plus --config)."""
    # A flag left out stays out of the namespace, so the config file's value is not overridden.
    parser.argument_default = argparse.SUPPRESS
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="read settings from a .toml or .json file; flags given here override it",
    )
    _model_flags(parser.add_argument_group("model"))
    _repository_flags(parser.add_argument_group("model repository"))
    _placement_flags(parser.add_argument_group("placement"))
    _batching_flags(parser.add_argument_group("batching"))
    _http_flags(parser.add_argument_group("HTTP"))
    _observability_flags(parser.add_argument_group("observability"))
    add_ray_flags(parser.add_argument_group("Ray Serve"))
    add_kserve_flags(parser.add_argument_group("KServe (what its runtime passes)"))


def _model_flags(model: argparse._ArgumentGroup) -> None:
    model.add_argument(
        "--model",
        action="append",
        help=f"embedded model name (seed-mlp, wide-mlp) or 'module:callable' factory "
        f"returning an nn.Module (default {_D.model}); repeat it to serve several models, "
        "each with its own batcher and replicas",
    )
    model.add_argument(
        "--name",
        help="the name the model is served under (default: an embedded model's name, "
        "MODULE-CALLABLE for a 'module:callable' factory, the file's stem for --exported and "
        "--torchscript)",
    )
    model.add_argument("--model-version", help=f"version served (default {_D.model_version})")
    model.add_argument(
        "--weights",
        metavar="FILE",
        help="weights to load into the model: .safetensors, or .pt loaded with weights_only=True",
    )
    model.add_argument("--exported", metavar="FILE.pt2", help="a torch.export program to serve")
    model.add_argument(
        "--torchscript",
        metavar="FILE.pt",
        help="a TorchScript archive (torch.jit.save) to serve; it records no inputs: declare "
        "them with --input",
    )
    model.add_argument(
        "--labels",
        metavar="FILE",
        help="class names, one per line, for outputs asked for as classes (Triton's "
        "classification extension; default: the module's torchplace_labels)",
    )
    model.add_argument(
        "--input",
        dest="inputs",
        action="append",
        metavar="NAME:DATATYPE:DIMS",
        help="declare an input, e.g. input:FP32:-1,8 (-1 = batch dimension; DATATYPE is an "
        "OIP datatype such as FP32, FP16, BF16, INT64); repeatable; overrides the model's own "
        "declaration",
    )
    model.add_argument(
        "--output",
        dest="outputs",
        action="append",
        metavar="NAME:DATATYPE:DIMS",
        help="declare an output, e.g. output:FP32:-1,2; repeatable",
    )
    model.add_argument(
        "--dry-run-shape",
        dest="dry_run_shapes",
        action="append",
        metavar="NAME:DIMS",
        help="the row shape the start-up dry runs give an input with variable dimensions, e.g. "
        "image:3,224,224 for an input declared image:FP32:-1,3,-1,-1 (Triton's model_warmup); "
        "repeatable (default: each variable dimension 1)",
    )


def _repository_flags(repo: argparse._ArgumentGroup) -> None:
    repo.add_argument(
        "--model-repository",
        metavar="DIR",
        help="serve the models of DIR: one directory per model with a config.toml and numbered "
        "version directories (see docs/serve.md); a --model other than the default adds a model "
        "next to them",
    )
    repo.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        help="Triton's modes: none (load all at start; load/unload refused), explicit "
        "(POST /v2/repository/models/M/load and /unload), poll (watch DIR) "
        f"(default {_D.model_control_mode})",
    )
    repo.add_argument(
        "--load-model",
        dest="load_models",
        action="append",
        metavar="NAME",
        help="in explicit mode, a repository model loaded at start ('*': all); repeatable",
    )
    repo.add_argument(
        "--repository-poll-secs",
        type=float,
        metavar="S",
        help=f"in poll mode, seconds between scans, 0.1..3600 (default {_D.repository_poll_secs:g})",
    )
    repo.add_argument(
        "--memory-budget",
        metavar="BYTES",
        help="bytes each device may hold for the loaded models (e.g. 2GiB): a load whose "
        "weights + activation peak would not fit is refused with the numbers (default: none; "
        "a CUDA device is also checked against its free memory)",
    )


def _placement_flags(place: argparse._ArgumentGroup) -> None:
    place.add_argument(
        "--device",
        help=f"device to serve on: auto, cpu, cuda, cuda:N, mps (default {_D.device})",
    )
    place.add_argument(
        "--devices",
        metavar="LIST",
        help="several devices, comma-separated (cuda:0,cuda:1) or 'all'; overrides --device",
    )
    place.add_argument(
        "--dtype",
        metavar="{" + ",".join(SERVING_DTYPES) + "}",
        help="serving precision: each replica's floating weights are cast to it on the device "
        "(aliases fp32, fp16, bf16); float inputs (BF16 ones too) cross once and are cast to it "
        "on the device, outputs keep their declared datatype (default: the model's own dtypes)",
    )
    place.add_argument(
        "--replicas-per-device",
        type=int,
        metavar="N",
        help=f"model copies per device (default {_D.replicas_per_device})",
    )
    place.add_argument(
        "--fallback",
        choices=["cpu"],
        help="serve from a CPU replica while no accelerator replica is healthy",
    )
    place.add_argument(
        "--failure-threshold",
        type=int,
        metavar="N",
        help=f"consecutive failures before a replica leaves the pool (default {_D.failure_threshold})",
    )
    place.add_argument(
        "--torch-threads",
        type=int,
        metavar="N",
        help="torch intra-op threads, 1 to 1024 (default on CPU: (cores - 1) / CPU replicas)",
    )
    place.add_argument(
        "--gil-switch-interval-ms",
        type=float,
        metavar="MS",
        help="how long the event loop may keep the GIL while a replica's worker thread waits "
        "for it between torch ops (Python's own default is 5 ms; default "
        f"{_D.gil_switch_interval_ms})",
    )
    place.add_argument(
        "--inline-batch-ms",
        type=float,
        metavar="MS",
        help="a sole CPU replica whose full batch takes at most MS in its warm dry run runs "
        "its batches on the event loop, without a worker thread's GIL hand-overs, once its "
        "first real batches were cheap on the worker thread too (0: always a worker thread; "
        f"default {_D.inline_batch_ms})",
    )
    place.add_argument(
        "--inline-full-batch-ms",
        type=float,
        metavar="MS",
        help="a sole CPU replica dearer than --inline-batch-ms whose full batch takes at most "
        "MS runs a full batch on the event loop when no other request waits behind it (a "
        "closed loop of at most a batch of clients) and no other model is served, every other "
        f"batch on its worker thread (0: never; default {_D.inline_full_batch_ms})",
    )


def _batching_flags(batch: argparse._ArgumentGroup) -> None:
    batch.add_argument(
        "--max-batch-size",
        type=int,
        metavar="N",
        help=f"most rows per batch; a larger request runs as several (default {_D.max_batch_size})",
    )
    batch.add_argument(
        "--unbatched",
        action="store_true",
        help="the model takes whole tensors (Triton's max_batch_size 0): each request goes to "
        "it as sent, one per call; declare shapes as -1 then the whole shape (the batching "
        "flags are not used)",
    )
    batch.add_argument(
        "--max-request-rows",
        type=int,
        metavar="N",
        help=f"most rows per request; more gets 413 (default {_D.max_request_rows})",
    )
    batch.add_argument(
        "--max-delay-ms",
        type=float,
        metavar="MS",
        help=(
            "longest wait to fill a batch, counted from its first request's arrival or, "
            f"when that request waited for a busy replica, from the replica freeing up "
            f"(default {_D.max_delay_ms})"
        ),
    )
    batch.add_argument(
        "--max-queue",
        type=int,
        metavar="N",
        help=f"queued requests (per priority level) before new ones get 503 (default {_D.max_queue})",
    )
    batch.add_argument(
        "--max-queue-wait-ms",
        type=float,
        metavar="MS",
        help="refuse a request at once (503 + Retry-After) when the queued work ahead of it "
        f"would take longer, from measured batch times; 0 = never (default {_D.max_queue_wait_ms:g})",
    )
    batch.add_argument(
        "--default-timeout-ms",
        type=float,
        metavar="MS",
        help="deadline of a request that gives none (its 'timeout' parameter in microseconds, "
        "or an Inference-Timeout-Us header); still queued past it: dropped, 504; 0 = none "
        f"(default {_D.default_timeout_ms:g})",
    )
    batch.add_argument(
        "--priority-levels",
        type=int,
        metavar="N",
        help="priority levels of the queue, 1 served first (a request's 'priority' parameter; "
        f"default {_D.priority_levels})",
    )
    batch.add_argument(
        "--default-priority",
        type=int,
        metavar="LEVEL",
        help="level of a request that gives none or 0 (default: the lowest)",
    )
    batch.add_argument(
        "--priority-queue-limits",
        metavar="N,N",
        help="a queue limit per priority level, highest first (default: --max-queue each)",
    )
    batch.add_argument(
        "--allow-nan",
        action="store_true",
        help="accept NaN/inf in float inputs (refused with 400 by default)",
    )


def _http_flags(http: argparse._ArgumentGroup) -> None:
    http.add_argument("--host", help=f"address to bind (default {_D.host})")
    http.add_argument("--port", type=int, help=f"port to bind, 0 = any free (default {_D.port})")
    http.add_argument(
        "--grpc-port",
        type=int,
        help="port of the Open Inference Protocol over gRPC (the grpc extra); 0 = off "
        "(default 8001 when the extra is installed, any free port when --port is 0)",
    )
    http.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="N",
        help=f"largest request body; larger gets 413 (default {_D.max_body_bytes // MIB} MiB)",
    )
    http.add_argument(
        "--request-timeout",
        dest="request_timeout_s",
        type=float,
        metavar="S",
        help=(
            "seconds a request (over gRPC: a call's request message) may take to arrive, or "
            f"to be answered (default {_D.request_timeout_s:g})"
        ),
    )
    http.add_argument(
        "--keepalive-timeout",
        dest="keepalive_timeout_s",
        type=float,
        metavar="S",
        help=(
            "idle keep-alive connections close after this, and so do gRPC connections and "
            "ModelStreamInfer streams with nothing in flight (default "
            f"{_D.keepalive_timeout_s:g})"
        ),
    )
    http.add_argument(
        "--drain-timeout",
        dest="drain_timeout_s",
        type=float,
        metavar="S",
        help="on SIGTERM, longest wait for queued and in-flight requests, grace included "
        f"(default {_D.drain_timeout_s:g})",
    )
    http.add_argument(
        "--drain-grace",
        dest="drain_grace_s",
        type=float,
        metavar="S",
        help="on SIGTERM, seconds the server still takes connections (readiness false, new "
        "inference requests 503 + Connection: close) before it closes the listener without "
        f"resetting any queued connection (default {_D.drain_grace_s:g})",
    )
    http.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="require 'Authorization: Bearer TOKEN' (token read from FILE) on all but health routes",
    )
    http.add_argument(
        "--allow-client-shm",
        action="store_true",
        help="let clients on this machine register system shared-memory regions and pass "
        "tensors through them (Triton's extension; off by default: a client may then read and write any "
        "shared-memory object this server's user can open)",
    )


def _observability_flags(obs: argparse._ArgumentGroup) -> None:
    obs.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_false",
        help="turn off /metrics and per-request metrics",
    )
    obs.add_argument(
        "--trace-file",
        metavar="FILE.json",
        help="write a trace of requests and stages (see --trace-format)",
    )
    obs.add_argument(
        "--trace-format",
        choices=TRACE_FORMATS,
        help="the trace file's format: chrome (Chrome/Perfetto, one file per model version) or "
        "triton (Triton's JSON trace, one file for the server, as its trace_summary.py reads "
        f"it; log_frequency N writes FILE.0, FILE.1, ...) (default {_D.trace_format})",
    )
    obs.add_argument("--log-level", choices=LOG_LEVELS, help=f"log level (default {_D.log_level})")


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """The config file (if any) with the flags given on the command line applied on top."""
    values: dict[str, Any] = dict(vars(args))
    config_file = values.pop("config", None)
    base = ServeConfig.from_file(config_file) if config_file is not None else ServeConfig()
    known = set(ServeConfig.field_names())
    return base.with_overrides(
        {k: v for k, v in values.items() if k in known}, source="command line"
    )


def _check_trace_file(path: Path | None) -> None:
    """Refuse a trace file that cannot be written now, not after hours of serving."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(
            f"--trace-file {str(path)!r} is a directory; give a file path such as trace.json"
        )
    if not path.parent.is_dir():
        raise ConfigError(
            f"--trace-file {str(path)!r}: the directory {str(path.parent)!r} does not exist; "
            "create it or give a path in an existing directory"
        )


#: Modules of the ``serve`` extra that the server cannot run without (uvloop is optional).
_SERVE_EXTRA = ("httptools", "orjson", "prometheus_client")


def _require_serve_extra() -> None:
    """Raise :class:`ConfigError` naming the extra to install when one of its modules is missing."""
    missing = [name for name in _SERVE_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"torchplace serve needs the serve extra ({', '.join(missing)} not installed); "
            "run: pip install 'torchplace[serve]'"
        )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns 0 after a clean drain."""
    report.require_torch()  # the model and the engine import it: say why it cannot be
    check_ray_flags(args)
    config = kserve_config(args, config_from_args(args))
    _check_trace_file(config.trace_file)
    logging.getLogger("torchplace").setLevel(config.log_level.upper())
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    _require_serve_extra()
    if getattr(args, "engine", "local") == "ray":
        return run_on_ray(args, config)
    from torchplace.serve.running import new_event_loop, serve

    # process-wide, as the command owns its process: a worker thread back from a torch op
    # waits at most this long for the GIL while the loop decodes and encodes requests
    sys.setswitchinterval(config.gil_switch_interval_ms / 1000)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(serve(config, freeze_gc=True))
    finally:
        loop.close()
