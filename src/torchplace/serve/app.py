"""The Open Inference Protocol routes of ``torchplace serve`` over the models it serves.

:class:`App` maps KServe v2 REST routes (declared in :mod:`torchplace.serve.routes`) onto the
engines of a :class:`~torchplace.serve.registry.Registry` (one per model version: anything
shaped like :class:`EngineLike`, in practice :class:`torchplace.serve.engine.Engine`), looked up
by name and version at each request, and serves them with
:class:`~torchplace.serve.http.HttpServer`. :meth:`App.shutdown` drains: readiness turns false,
new inference requests get 503, queued and in-flight ones finish, within the drain timeout.
Running an app (signals, a background thread) is :mod:`torchplace.serve.running`'s.

Routes: ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2``, ``GET /v2/models/{name}``
``[/versions/{v}]``, ``GET .../ready``, ``POST .../infer``, ``GET .../config`` and ``GET .../stats``
(Triton's model configuration and statistics extensions, :mod:`torchplace.serve.triton`),
``GET /v2/models/stats``, ``GET /metrics`` (Prometheus, every model's series), ``GET
/v2/openapi.json`` and Triton's repository extension (``POST /v2/repository/index``,
``.../models/{name}/load`` and ``/unload``, :mod:`torchplace.serve.reload`); KServe's V1
protocol beside them (``POST /v1/models/{name}:predict``, :mod:`torchplace.serve.protocol_v1`,
``GET /v1/models[/{name}]`` and ``GET /``, its liveness probe). Every GET route answers HEAD.
Errors are ``{"error": "..."}`` with the statuses of the design's error table. With a bearer
token configured every route but the health probes needs ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import re
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote_to_bytes

import numpy as np
import orjson

from torchplace import __version__
from torchplace.errors import (
    ConfigError,
    InputError,
    ModelNotFoundError,
    PayloadTooLargeError,
    ServeError,
    UnsupportedMediaTypeError,
)
from torchplace.models import TensorSpec
from torchplace.serve import protocol, protocol_v1, tracing
from torchplace.serve.http import Answer, HttpServer, Request, Response, error_response
from torchplace.serve.log_settings import LogSettings
from torchplace.serve.metrics import merged_text
from torchplace.serve.registry import ModelHandle
from torchplace.serve.repository import inline_config, unload_parameters
from torchplace.serve.routes import MODEL, REPOSITORY, ROUTES, SHARED_MEMORY
from torchplace.serve.shm import Region, SharedMemoryRegions
from torchplace.serve.ticket import Ticket
from torchplace.serve.trace_settings import TraceSettings, from_json, tracers
from torchplace.serve.triton import NOT_SERVED, extensions, model_statistics
from torchplace.serve.triton_devices import CpuUsage, devices_text
from torchplace.serve.triton_metrics import triton_text
from torchplace.serve.triton_trace import Stamps, monotonic_to_perf

if TYPE_CHECKING:
    from torchplace.serve.config import ServeConfig
    from torchplace.serve.reload import ModelControl

__all__ = ["App", "EngineLike", "bearer_matches", "load_token"]

logger = logging.getLogger("torchplace.serve")

_BINARY = b"application/octet-stream"
_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
# `curl -d` and many scripts send JSON as form-encoded: read as JSON, as Triton and KServe
# read a body whatever its type (text/plain, as simple a type for a browser, is taken too)
_ACCEPTED_TYPES = (
    b"application/json",
    _BINARY,
    b"text/plain",
    b"application/x-www-form-urlencoded",
)
_RETRY = [(b"retry-after", b"1")]
_VARY = (b"vary", b"accept-encoding")  # an answer Accept-Encoding may compress
_CLOSE_GRACE_S = 1.0  # after a drain, how long idle connections may still get a clean 503
_SHM_KINDS = (b"systemsharedmemory", b"cudasharedmemory")
#: the routes of Triton's extensions this server does not serve (:data:`NOT_SERVED`)
_MODEL_NOT_SERVED = {
    b"generate": "generate",
    b"generate_stream": "generate",
}


class SubmittedLike(Protocol):
    """A queued request (:class:`torchplace.serve.engine.Submitted`)."""

    @property
    def future(self) -> Ticket[dict[str, np.ndarray[Any, Any]]] | asyncio.Future[Any]: ...
    @property
    def device(self) -> str: ...


class EngineLike(Protocol):
    """What the HTTP side needs from an engine (see :mod:`torchplace.serve.engine`)."""

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: class labels per output (Triton's classification extension)
    labels: Mapping[str, tuple[str, ...]]
    max_batch_size: int
    #: the most rows one request may carry (more is split into batches by the engine)
    max_request_rows: int
    platform: str
    #: the serving precision (``--dtype``) the replicas run in; None = the model's own dtypes
    dtype: str | None

    async def start(self) -> None: ...
    def is_ready(self) -> bool: ...
    def is_live(self) -> bool: ...
    async def infer(
        self,
        inputs: dict[str, np.ndarray[Any, Any]],
        *,
        timeout_s: float | None = None,
        priority: int | None = None,
        stamps: Stamps | None = None,
    ) -> dict[str, np.ndarray[Any, Any]]: ...
    def submit(
        self,
        inputs: dict[str, np.ndarray[Any, Any]],
        *,
        timeout_s: float | None = None,
        priority: int | None = None,
        caller: Any = None,
        rows: int | None = None,
        stamps: Stamps | None = None,
    ) -> SubmittedLike: ...
    async def drain(self, timeout: float, reason: str | None = None) -> None: ...
    async def stop(self) -> None: ...
    def share_loop(self, shared: bool) -> None: ...
    def metrics_text(self) -> bytes: ...
    def observe_request(self, status: int, seconds: float, device: str | None = None) -> None: ...


def bearer_matches(given: bytes, token: bytes) -> bool:
    """Whether an ``Authorization`` value is ``Bearer TOKEN`` (the scheme in any case, as
    RFC 9110 11.1 has it), compared in constant time."""
    scheme, _, credential = given.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), token)


def load_token(path: Path) -> bytes:
    """Read a bearer token file (surrounding whitespace dropped); ConfigError if unusable."""
    try:
        token = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read auth token file {str(path)!r}: {exc.strerror}") from None
    if not token or any(c <= 0x20 or c >= 0x7F for c in token):
        raise ConfigError(
            f"auth token file {str(path)!r} must hold one printable token without spaces"
        )
    return token


_Route = Callable[[Request], Answer]


class App:
    """KServe v2 routes over the models of a :class:`~torchplace.serve.reload.ModelControl`."""

    def __init__(self, control: ModelControl, config: ServeConfig) -> None:
        self.control = control
        self.registry = control.registry
        self.config = config
        self.server = HttpServer(
            self.handle,
            max_body_bytes=config.max_body_bytes,
            request_timeout_s=config.request_timeout_s,
            keepalive_timeout_s=config.keepalive_timeout_s,
        )
        self.server.expect_check = self.expect_check
        self._token = load_token(config.auth_token_file) if config.auth_token_file else None
        self._started = False
        self._stopped = False
        #: the gRPC port served next to this app (set by :func:`~torchplace.serve.running.serve`)
        self.grpc_port: int | None = None
        self._allow_nan = config.allow_nan
        self._metrics_on = config.metrics
        #: the host's CPU time between two scrapes (Triton's nv_cpu_utilization)
        self._cpu_usage = CpuUsage() if config.metrics else None
        #: the client shared-memory regions (REST and gRPC)
        self.regions = SharedMemoryRegions(allowed=config.allow_client_shm)
        self._server_meta = protocol.server_metadata(
            name="torchplace", version=__version__, extensions=extensions(config)
        )
        self._openapi: bytes | None = None
        #: Triton's logging and trace extensions (REST and gRPC)
        self.log_settings = LogSettings()
        self.trace_settings = TraceSettings(config.trace_file)
        self._routes, self._open = self._routing_table()
        self.registry.subscribe(self._rebuild_routes)

    @property
    def engine(self) -> EngineLike:
        """The engine of the first model served (the only one in a one-model server)."""
        handles = self.registry.handles()
        if not handles:
            raise ModelNotFoundError("no model is loaded")
        return handles[0].engine

    def _rebuild_routes(self) -> None:
        self._routes, self._open = self._routing_table()
        self._openapi = None  # the models it describes changed
        self.trace_settings.adopt(tracers(self.registry))  # a model loaded: its settings

    def _routing_table(self) -> tuple[dict[bytes, tuple[bytes, _Route]], set[bytes]]:
        """Exact paths (from :data:`ROUTES`, filled in for every loaded model and version)
        answered without parsing; anything else goes through :meth:`_route_slow`."""
        table: dict[bytes, tuple[bytes, _Route]] = {}
        public: set[bytes] = set()
        keys = [(n, "") for n in self.registry.names()]
        keys += [(h.name, h.version) for h in self.registry.handles()]
        for route in ROUTES:
            handler: Callable[..., Any] = getattr(self, route.handler)
            for template, _ in route.paths():
                if template.startswith((REPOSITORY, SHARED_MEMORY)):
                    continue  # any model or region name: parsed in _route_slow
                if MODEL not in template:
                    fixed, method = template.encode(), route.method.encode()
                    if fixed in table and table[fixed][0] != method:
                        method = b""  # more than one method: the handler tells them apart
                    table[fixed] = (method, handler)
                    public.update([template.encode()] if route.public else [])
                    continue
                versioned = "{MODEL_VERSION}" in template
                for name, version in keys:
                    if bool(version) != versioned:
                        continue
                    path = template.replace("{MODEL_NAME}", name)
                    path = path.replace("{MODEL_VERSION}", version)
                    bound = functools.partial(handler, key=(name, version))
                    method = route.method.encode()
                    if path.encode() in table and table[path.encode()][0] != method:
                        method = b""  # more than one method: the handler tells them apart
                    table[path.encode()] = (method, bound)
        table[b"/v2/"] = table[b"/v2"]
        return table, public

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port the server listens on."""
        return self.server.port

    @property
    def ready(self) -> bool:
        """Ready to take inference requests: engine ready and not draining."""
        if not self._started or self.server.draining:
            return False
        return all(h.engine.is_ready() for h in self.registry.handles())

    async def start(self) -> None:
        """Listen first (liveness answers during warm-up), then load the models."""
        await self.server.start(self.config.host, self.config.port)
        await self.control.start()
        self._started = True

    async def shutdown(self, timeout: float, grace: float = 0.0) -> None:
        """Drain, losing nothing: readiness false at once; for ``grace`` seconds connections
        are still taken (new inference requests get 503 + ``Connection: close``) so that load
        balancers notice; then the listener closes without resetting a connection the kernel
        accepted; queued and in-flight requests finish, and bodies still arriving are read and
        answered 503, within ``timeout`` seconds of the start."""
        deadline = time.monotonic() + timeout
        self.server.draining = True
        engine_drain = asyncio.ensure_future(self._drain_engine(deadline))
        if grace > 0:
            await asyncio.sleep(grace)
        await self.server.close_listener(max(0.5, min(2.0, deadline - time.monotonic())))
        await engine_drain
        server = self.server
        while (server.in_flight or server.unsent or server.receiving) and (
            time.monotonic() < deadline
        ):
            await asyncio.sleep(0.005)
        # Open keep-alive connections get a short grace in which any request still gets a
        # clean 503 + Connection: close instead of a closed socket.
        grace_end = min(max(deadline, time.monotonic()), time.monotonic() + _CLOSE_GRACE_S)
        while self.server.connections and time.monotonic() < grace_end:
            await asyncio.sleep(0.01)
        await self.server.close()
        await self.control.stop(0.0)
        self.log_settings.close()
        self._stopped = True

    async def _drain_engine(self, deadline: float) -> None:
        """Wait for the HTTP requests in flight, then for the engine's queue, until
        ``deadline``."""
        while self.server.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        engines = [h.engine for h in self.registry.handles()]
        left = max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(
                asyncio.gather(*(e.drain(left) for e in engines)),
                max(0.01, deadline - time.monotonic()),
            )
        except (asyncio.TimeoutError, ServeError):
            logger.warning("drain did not finish in time; queued requests were answered 503")

    # -- dispatch --------------------------------------------------------------------------
    def handle(self, request: Request) -> Answer:
        """Route one request (the HTTP server's handler)."""
        if len(request.body) >= _INFLATE_OFF_LOOP and request.inflated is None:
            coding = _CODINGS.get(request.headers.get(b"content-encoding", b"").lower())
            if coding is not None and (self._token is None or self._check_auth(request) is None):
                return self._inflated_then(request, coding)
        route = self._routes.get(request.path)
        if route is None:
            return self._route_slow(request)
        method, fn = route
        if self._token is not None and request.path not in self._open:
            denied = self._check_auth(request)
            if denied is not None:
                return denied
        if request.method != method and method:
            refused = _wrong_method(request, method)
            if refused is not None:
                return refused
        return fn(request)

    async def _inflated_then(self, request: Request, coding: tuple[str, int]) -> Response:
        """Undo a large body's content coding in a worker thread (zlib lets go of the GIL),
        then route the request: a small body inflated to many MiB would hold the event loop,
        and every client with it, for as long as inflating takes."""
        loop = asyncio.get_running_loop()
        try:
            request.inflated = await loop.run_in_executor(
                None, _inflate, request.body, coding, self.config.max_body_bytes
            )
        except ServeError as exc:
            request.inflated = exc  # told by the route that reads the body, as it would be
        answer = self.handle(request)
        return answer if isinstance(answer, Response) else await answer

    def expect_check(self, request: Request) -> Response | None:
        """The answer a request that asks for ``100-continue`` gets whatever its body, given
        its head (no body): a missing or wrong token, an inference (OIP's, or KServe V1's
        ``:predict``) on a model or version not served; None when the body is needed. Anything
        less plain waits for its body."""
        path = request.path
        if path in self._routes:
            if self._token is not None and path not in self._open:
                return self._check_auth(request)
            return None
        if not path.startswith(b"/") or path == b"/" or b"%" in path:
            return None  # routed once rewritten (see _route_slow), or public
        if self._token is not None and path.rstrip(b"/") not in self._open:
            denied = self._check_auth(request)
            if denied is not None:
                return denied
        parts = path.split(b"/")
        if not self._started:
            return None
        key: tuple[str, str] | None = None
        if len(parts) == 4 and parts[:3] == [b"", b"v1", b"models"] and request.method == b"POST":
            name, colon, verb = _name(parts[3]).rpartition(":")  # KServe V1's :predict
            key = (name, "") if colon and verb == "predict" else None
        elif len(parts) >= 5 and parts[:3] == [b"", b"v2", b"models"] and parts[-1] == b"infer":
            versioned = len(parts) == 7 and parts[4] == b"versions" and parts[5]
            if len(parts) == 5 or versioned:
                key = (_name(parts[3]), _name(parts[5]) if versioned else "")
        if key is None:
            return None
        try:
            self.registry.get(*key)
        except ModelNotFoundError as exc:
            return error_response(404, str(exc))
        return None

    def _check_auth(self, request: Request) -> Response | None:
        assert self._token is not None
        given = request.headers.get(b"authorization", b"")
        if bearer_matches(given, self._token):
            return None
        why = "missing" if not given else "wrong"
        return error_response(
            401,
            f"{why} bearer token; send 'Authorization: Bearer TOKEN'",
            [(b"www-authenticate", b'Bearer realm="torchplace"')],
        )

    def _route_slow(self, request: Request) -> Answer:
        path = request.path
        if path[:8].lower().startswith((b"http://", b"https://")):  # a scheme in any case
            # absolute-form (RFC 9112, 3.2.2): the route is the path after the authority
            after = path.partition(b"://")[2]
            slash = after.find(b"/")
            request.path = after[slash:] if slash >= 0 else b"/"
            return self.handle(request)
        parts = path.split(b"/")
        if b"%" in path:
            # each segment decoded once, after the split: an encoded slash (%2F) is part of a
            # name, never a separator (RFC 3986, 2.2), so /v2%2Frepository/... is not a route
            parts = [unquote_to_bytes(part) for part in parts]
            if all(part.find(b"/") < 0 for part in parts):
                path = b"/".join(parts)
                if path in self._routes:
                    request.path = path
                    return self.handle(request)
        if path == b"/":  # KServe V1's liveness probe, public as /v2/health/live is
            return _wrong_method(request, b"GET") or Response(200, b'{"status":"alive"}')
        if path == b"*":  # the asterisk-form: the server as a whole (RFC 9112, 3.2.4)
            return _asterisk(request)
        if self._token is not None and path.rstrip(b"/") not in self._open:
            denied = self._check_auth(request)
            if denied is not None:
                return denied
        if len(parts) >= 4 and parts[:3] == [b"", b"v2", b"models"]:
            return self._route_model(request, parts[3], parts[4:])
        if len(parts) >= 4 and parts[:3] == [b"", b"v2", b"repository"]:
            return self._repository(request, parts[3:])
        if len(parts) >= 4 and parts[:2] == [b"", b"v2"] and parts[2] in _SHM_KINDS:
            return self._shared_memory(request, parts[2] == b"cudasharedmemory", parts[3:])
        if parts[:3] == [b"", b"v1", b"models"]:
            return self._route_v1(request, [p for p in parts[3:] if p])
        if path.endswith(b"/") and path.rstrip(b"/") in self._routes:
            request.path = path.rstrip(b"/")
            return self.handle(request)
        return error_response(
            404,
            f"no route {_text(request.path)}; see /v2/openapi.json for the routes served",
        )

    def _route_v1(self, request: Request, rest: list[bytes]) -> Answer:
        """KServe's V1 protocol: ``GET /v1/models``, ``GET /v1/models/{name}`` and
        ``POST /v1/models/{name}:predict``; ``:explain`` is answered 501, as KServe answers it
        for a model without an explainer."""
        if len(rest) > 1:
            return error_response(404, f"no route {_text(request.path)}")
        # the verb follows the last colon: a model's name may hold colons (x:y:predict)
        segment = _name(rest[0]) if rest else ""
        name, colon, verb = segment.rpartition(":")
        if not colon or (verb not in _V1_VERBS and request.method in (b"GET", b"HEAD")):
            name, verb = segment, ""  # GET /v1/models/x:y is the status of the model x:y
        if verb not in _V1_VERBS:
            return error_response(
                404,
                f"no route {_text(request.path)}: KServe V1 serves POST "
                "/v1/models/{name}:predict (and :explain, answered 501), and GET "
                "/v1/models/{name} for the model's status",
            )
        refused = _wrong_method(request, b"POST" if verb else b"GET")
        if refused is not None:
            return refused
        if not rest:
            return self._models_list(request)
        if verb == "explain":
            return self._explain(name)
        if verb:
            return self._infer(request, (name, ""), v1=True)
        return self._model_ready(request, (name, ""))  # V1's model status is the same object

    def _explain(self, name: str) -> Response:
        """KServe V1's ``:explain``: no model served here has an explainer."""
        try:
            self.registry.get(name, "")
        except ServeError as exc:
            return error_response(exc.status, str(exc))
        return error_response(
            501,
            f"model {name!r} has no explainer: torchplace serve answers KServe V1's :predict, "
            f"not :explain; POST the same body to /v1/models/{name}:predict for the "
            "predictions, and run an explainer (KServe's explainer component) beside the server "
            "for explanations",
        )

    def _route_model(self, request: Request, raw_name: bytes, rest: list[bytes]) -> Answer:
        """``/v2/models/{name}[/versions/{v}][/what]`` not in the exact table."""
        name = _name(raw_name)
        version = ""
        if rest[:1] == [b"versions"]:
            if len(rest) < 2 or not rest[1]:  # /versions, /versions/, /versions//infer
                return error_response(
                    404,
                    f"missing version after /versions/ in {_text(request.path)}; give one (GET "
                    f"/v2/models/{name} lists them), or leave /versions/ out for the latest",
                )
            version, rest = _name(rest[1]), rest[2:]
        try:
            self.registry.get(name, version)
        except ModelNotFoundError as exc:
            if not self._started:
                return error_response(503, "the models are still loading; retry shortly", _RETRY)
            return error_response(404, str(exc))
        if rest and rest[-1] == b"":
            rest = rest[:-1]
        if rest == [b"trace", b"setting"] and not version:  # Triton's: per model, no version
            return self._trace(request, name)
        what = rest[0].decode(errors="replace") if rest else ""
        if len(rest) > 1 or what not in ("", "ready", "infer", "config", "stats"):
            extension = _MODEL_NOT_SERVED.get(b"/".join(rest))
            why = "" if extension is None else ": " + NOT_SERVED[extension].replace("{name}", name)
            return error_response(404, f"no route {_text(request.path)}{why}")
        canonical = MODEL.replace("{MODEL_NAME}", name) + (
            f"/versions/{version}" if version else ""
        )
        request.path = (canonical + ("/" + what if what else "")).encode()
        if request.path not in self._routes:
            return error_response(404, f"no route {_text(request.path)}")
        return self.handle(request)

    def _repository(self, request: Request, rest: list[bytes]) -> Answer:
        """The repository extension: ``index``, ``models/{m}/load``, ``models/{m}/unload``."""
        if request.method != b"POST":
            return error_response(405, f"use POST on {_text(request.path)}", [(b"allow", b"POST")])
        if rest[1:] == [b"index"] or (
            len(rest) == 4 and rest[1] == b"models" and rest[3] in (b"load", b"unload")
        ):  # /v2/repository/{repository_name}/...: Triton's route, and its refusal
            return error_response(
                501,
                f"'repository_name' specification is not supported (got {_text(rest[0])!r}); "
                "this server has one model repository: drop the name, as in "
                "/v2/repository/index and /v2/repository/models/NAME/load",
            )
        raw = request.body
        try:
            raw = self._unencoded(request)
            body = _json_object(raw)
        except InputError as exc:
            deep = "depth limit" in str(exc)
            if deep and rest == [b"index"] and _READY_NESTED.match(bytes(raw[:256])):
                # an array or object nested past what the parser reads: not a boolean either
                return error_response(
                    400,
                    "Invalid value for 'ready': expected a boolean, got an array or object "
                    "nested too deeply to read",
                )
            return error_response(exc.status, str(exc))
        if rest == [b"index"]:
            # null is "not given", as for the other optional fields: MLServer's
            # RepositoryIndexRequest(ready=None).model_dump() sends {"ready": null}
            ready = body.get("ready")
            ready = False if ready is None else ready
            if not isinstance(ready, bool):
                return error_response(
                    400, f"Invalid value for 'ready': expected a boolean, got {_json_text(ready)}"
                )
            return Response(200, orjson.dumps(self._index(ready)))
        if len(rest) == 3 and rest[0] == b"models" and rest[2] in (b"load", b"unload"):
            # a load (or an unload's drain) takes as long as it takes, as over gRPC: a 503
            # at --request-timeout, while it went on, told the client to retry (a reload)
            request.timed = False
            return self._control(_name(rest[1]), rest[2] == b"load", body)
        return error_response(404, f"no route {_text(request.path)}")

    def _shared_memory(self, request: Request, cuda: bool, rest: list[bytes]) -> Response:
        """The shared-memory extensions: ``[region/{name}/]status``, ``region/{name}/register``
        and ``[region/{name}/]unregister`` (:mod:`torchplace.serve.shm`)."""
        rest = rest[:-1] if len(rest) > 1 and rest[-1] == b"" else rest
        # the path is percent-decoded already (once: a name sent as r%2541 is 'r%41')
        name = _name(rest[1]) if len(rest) == 3 else None
        action = rest[-1]
        if (len(rest) == 3 and rest[0] != b"region") or len(rest) not in (1, 3) or (
            action not in (b"status", b"register", b"unregister")
        ) or (action == b"register" and name is None):  # fmt: skip
            return error_response(404, f"no route {_text(request.path)}")
        refused = _wrong_method(request, b"GET" if action == b"status" else b"POST")
        if refused is not None:
            return refused
        regions = self.regions
        try:
            if action == b"status":
                found = regions.cuda_status(name) if cuda else regions.status(name)
                return Response(200, orjson.dumps(found))
            if action == b"unregister":
                regions.cuda_unregister() if cuda else regions.unregister(name)
            elif cuda:
                regions.cuda_register(name or "")
            else:
                body = _json_object(self._unencoded(request))
                regions.register(name or "", body.get("key"), body.get("offset", 0),
                                 body.get("byte_size"))  # fmt: skip
        except ServeError as exc:
            return error_response(exc.status, str(exc))
        return Response(200, b"")

    def _index(self, ready: bool) -> list[dict[str, str]]:
        return self.registry.index(ready, self.control.repository_models())

    async def _control(self, name: str, load: bool, body: dict[str, Any]) -> Response:
        try:
            if load:
                await self.control.load(name, inline_config(body, name))
            else:
                unload_parameters(body)
                await self.control.unload(name)
        except ServeError as exc:
            return error_response(exc.status, str(exc))
        except ConfigError as exc:
            return error_response(400, str(exc))
        return Response(200, b"")

    # -- routes ----------------------------------------------------------------------------
    # A 503 of a health route carries the OIP's "error" beside its "ready": false (KServe
    # answers {"error": ...}; clients that report a failed request read that key).
    def _live(self, request: Request) -> Response:
        if not self._stopped:
            return Response(200, b'{"live":true}')
        return Response(503, orjson.dumps({"live": False, "error": "the server is stopping"}))

    def _ready(self, request: Request) -> Response:
        if self.ready:
            return Response(200, b'{"ready":true}')
        waiting = [h.name for h in self.registry.handles() if not h.engine.is_ready()]
        body = {"ready": False, "error": self._not_ready(waiting)}
        return Response(503, orjson.dumps(body), headers=list(_RETRY))

    def _model_ready(self, request: Request, key: tuple[str, str]) -> Response:
        try:
            handle = self.registry.get(*key)
        except ServeError as exc:
            return error_response(exc.status, str(exc))
        if self.ready and handle.engine.is_ready():
            return Response(200, b'{"name":%s,"ready":true}' % orjson.dumps(handle.name))
        waiting = [] if handle.engine.is_ready() else [handle.name]
        body = {"name": handle.name, "ready": False, "error": self._not_ready(waiting)}
        return Response(503, orjson.dumps(body), headers=list(_RETRY))

    def _not_ready(self, waiting: list[str]) -> str:
        """Why a readiness probe is answered 503 (``waiting``: the models not ready)."""
        if self.server.draining or self._stopped:
            return "the server is shutting down; retry elsewhere"
        if waiting:
            names = ", ".join(repr(name) for name in waiting)
            what = f"model {names} is" if len(waiting) == 1 else f"models {names} are"
            return (
                f"{what} not ready (still loading, or no replica in service); "
                "retry after Retry-After"
            )
        return "the server is not ready: it is still starting; retry after Retry-After"

    def _metadata(self, request: Request) -> Response:
        return Response(200, self._server_meta)

    def _models_list(self, request: Request) -> Response:
        return Response(200, orjson.dumps({"models": self.registry.names()}))

    def _model_metadata(self, request: Request, key: tuple[str, str]) -> Response:
        try:
            return Response(200, self.registry.get(*key).metadata)
        except ServeError as exc:
            return error_response(exc.status, str(exc))

    def _config_doc(self, request: Request, key: tuple[str, str]) -> Response:
        try:
            return Response(200, self.registry.get(*key).config)
        except ServeError as exc:
            return error_response(exc.status, str(exc))

    def _stats_doc(self, request: Request, key: tuple[str, str] | None = None) -> Response:
        if key is None:
            handles = self.registry.handles()
        else:
            # every loaded version when none is named; a model with none is not found
            handles = [] if key[1] else self.registry.versions(key[0])
            try:
                handles = handles or [self.registry.get(*key)]
            except ServeError as exc:
                return error_response(exc.status, str(exc))
        return Response(200, orjson.dumps(model_statistics([h.engine for h in handles])))

    def _logging(self, request: Request) -> Response:
        """Triton's logging extension: GET answers the log settings, POST changes them."""
        return self._settings(request, self.log_settings.document, self.log_settings.update)

    def _model_trace(self, request: Request, key: tuple[str, str]) -> Response:
        return self._trace(request, key[0])

    def _trace(self, request: Request, model: str | None = None) -> Response:
        """Triton's trace extension: GET answers the trace settings (the server's, or
        ``model``'s), POST changes them."""
        found = tracers(self.registry)
        settings = self.trace_settings
        return self._settings(
            request,
            lambda: settings.document(found, model),
            lambda body: settings.update(from_json(body), found, model),
        )

    def _settings(
        self,
        request: Request,
        read: Callable[[], dict[str, Any]],
        change: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> Response:
        """A settings route: GET (or HEAD) answers ``read()``, POST ``change(its JSON
        object)``, a refused change its status and why."""
        if request.method == b"POST":
            try:
                return Response(200, orjson.dumps(change(_json_object(self._unencoded(request)))))
            except ServeError as exc:
                return error_response(exc.status, str(exc))
        refused = _wrong_method(request, b"GET, HEAD, POST")
        if request.method not in (b"GET", b"HEAD") and refused is not None:
            return refused
        return Response(200, orjson.dumps(read()))

    def _metrics(self, request: Request) -> Response:
        if not self._metrics_on:
            return error_response(404, "metrics are turned off (--no-metrics)")
        engines = [h.engine for h in self.registry.handles()]
        own = engines[0].metrics_text() if len(engines) == 1 else merged_text(engines)
        devices = [d for e in engines for d in getattr(e, "devices", ())]
        triton = triton_text(engines) + devices_text(devices, self._cpu_usage)
        return Response(200, own + triton, _METRICS_TYPE)

    def _openapi_doc(self, request: Request) -> Response:
        handles = self.registry.handles()
        if self._openapi is None and handles:
            from torchplace.serve.openapi import openapi_document

            self._openapi = orjson.dumps(openapi_document(handles, auth=self._token is not None))
        if self._openapi is None:
            return error_response(503, "no model is loaded yet; retry shortly", list(_RETRY))
        return Response(200, self._openapi)

    def _infer(self, request: Request, key: tuple[str, str], v1: bool = False) -> Answer:
        """An inference request: OIP's, or KServe V1's ``:predict`` (``v1``)."""
        started = time.perf_counter()
        try:
            handle = self.registry.get(*key)
        except ServeError as exc:
            return error_response(exc.status, str(exc))
        if self.server.draining:
            refusal = error_response(
                503, "the server is shutting down; retry elsewhere", list(_RETRY)
            )
            refusal.close = True  # the client reconnects elsewhere (after Retry-After)
            return self._finish(handle, refusal, started)
        held: tuple[Region, ...] = ()
        try:
            decoded, held = self._decoded(request, handle, v1)
            timeout_us = _timeout_us(request.headers, decoded.timeout_us)
        except ServeError as exc:
            self.regions.release(held)
            return self._finish(handle, error_response(exc.status, str(exc)), started)
        handle.enter()  # held to the answer: a reload drains this version before releasing it
        stamps = _stamps(handle.engine, request, started, decoded.id)
        try:
            submitted = handle.engine.submit(
                handle.one_request(decoded.inputs),
                timeout_s=timeout_us / 1e6 if timeout_us else None,
                priority=decoded.priority,
                caller=_caller(request.headers),
                rows=1 if handle.unbatched else decoded.rows,
                stamps=stamps,
            )
        except Exception as exc:
            handle.leave()
            self.regions.release(held)
            return self._finish(handle, self._failure(exc), started)
        answer = _Answer(submitted.future)
        encode = self._encoded_v1 if v1 else self._encoded
        accepted = request.headers.get(b"accept-encoding")
        if accepted is not None:  # the answer compressed, as the client allows
            encode = functools.partial(_compressed, encode, accepted)
        submitted.future.add_done_callback(
            functools.partial(
                self._answer, encode, handle, decoded, (started, stamps), submitted, answer
            )
        )
        if held:  # after the answer's callback, which writes the outputs into them
            submitted.future.add_done_callback(lambda _: self.regions.release(held))
        return answer

    def _decoded(
        self, request: Request, handle: ModelHandle, v1: bool
    ) -> tuple[protocol.InferRequest, tuple[Region, ...]]:
        """The request decoded, and the shared-memory regions it holds until it is answered."""
        if v1:
            return self._decode_v1(request, handle), ()
        if self.regions.empty:  # none registered: none to hold
            return self._decode(request, handle), ()
        return self.regions.holding(self._decode, request, handle)

    def _decode(self, request: Request, handle: ModelHandle) -> protocol.InferRequest:
        body = self._body(request)
        header_length: int | None = None
        raw_length = request.headers.get(b"inference-header-content-length")
        if raw_length is not None:
            if not raw_length.isdigit() or len(raw_length) > 18:
                raise InputError(  # Triton's words first
                    f"Unable to parse Inference-Header-Content-Length, got: {_text(raw_length)}; "
                    "give the JSON header's length in bytes, a non-negative integer"
                )
            header_length = int(raw_length)
        return protocol.decode_infer_request(
            body,
            inputs=handle.inputs,
            outputs=handle.outputs,
            max_rows=handle.max_request_rows,
            header_length=header_length,
            allow_nan=self._allow_nan,
            regions=self.regions,
            model=handle.name,
        )

    def _decode_v1(self, request: Request, handle: ModelHandle) -> protocol.InferRequest:
        if handle.unbatched:
            raise InputError(
                f"model {handle.name!r} takes whole tensors (Triton's max_batch_size 0), which "
                "KServe V1's instances, one per row, cannot give; send the v2 protocol's "
                f"POST /v2/models/{handle.name}/infer"
            )
        return protocol_v1.decode_predict_request(
            self._body(request, 'a V1 request, {"instances": [...]} with one entry per row'),
            inputs=handle.inputs,
            outputs=handle.outputs,
            max_rows=handle.max_request_rows,
            allow_nan=self._allow_nan,
            model=handle.name,
        )

    def _body(self, request: Request, wanted: str = "an OIP inference request object") -> bytes:
        """The request's body, its media type checked and its content encoding undone
        (``wanted``: what an empty one is told to send)."""
        headers = request.headers
        ctype = headers.get(b"content-type")
        if ctype is not None and ctype != b"application/json":
            base = ctype.split(b";", 1)[0].strip().lower()
            if base not in _ACCEPTED_TYPES and not base.endswith(b"+json"):  # RFC 6839
                raise UnsupportedMediaTypeError(
                    f"content type {_text(base)!r} is not accepted; send application/json "
                    "(or application/octet-stream with Inference-Header-Content-Length)"
                )
        body = request.body  # _unencoded, inline: this is every inference's path
        encoding = headers.get(b"content-encoding")
        if encoding is not None and encoding.lower() not in (b"identity", b""):
            body = self._decompress(request, encoding.lower())
        if not body:
            raise InputError(f"the request body is empty; send {wanted}, with its Content-Length")
        return body

    def _unencoded(self, request: Request) -> bytes:
        """The request's body with its ``Content-Encoding`` (gzip, deflate) undone: every
        route that reads a body reads it so, not only inference."""
        encoding = request.headers.get(b"content-encoding")
        if encoding is None or encoding.lower() in (b"identity", b""):
            return request.body
        return self._decompress(request, encoding.lower())

    def _decompress(self, request: Request, encoding: bytes) -> bytes:
        done = request.inflated
        if isinstance(done, bytes):
            return done
        if done is not None:
            raise done
        coding = _CODINGS.get(encoding)
        if coding is None:
            raise UnsupportedMediaTypeError(
                f"content encoding {_text(encoding)!r} is not supported; use gzip, deflate or none"
            )
        return _inflate(request.body, coding, self.config.max_body_bytes)

    def _answer(
        self,
        encode: Callable[..., Response],
        handle: ModelHandle,
        decoded: protocol.InferRequest,
        timed: tuple[float, Stamps | None],
        submitted: SubmittedLike,
        answer: _Answer,
        future: Ticket[dict[str, np.ndarray[Any, Any]]],
    ) -> None:
        """The engine is done with a request: encode its outputs (or its error) as the
        answer. An answer already cancelled (the client went away, or the request timed out)
        is counted as a 503. ``timed``: when the request was read, and its front-end times
        while it is traced in Triton's format (its answer's send timed here: writing it is
        what setting the answer does)."""
        handle.leave()
        started, stamps = timed
        if answer.done():
            self._finish(handle, Response(503), started, submitted.device)
            if stamps is not None:
                stamps.abandoned()
            return
        try:
            outputs = future.result()
        except asyncio.CancelledError:
            response = error_response(503, "the request was cancelled; retry", list(_RETRY))
        except Exception as error:
            response = self._failure(error)
        else:
            try:
                response = encode(handle, decoded, handle.its_answer(outputs))
            except Exception as exc:
                response = self._failure(exc)
        response = self._finish(handle, response, started, submitted.device)
        if stamps is None:
            answer.set_result(response)
            return
        sending = time.perf_counter()
        answer.set_result(response)
        stamps.sent(sending, time.perf_counter())

    @staticmethod
    def _encoded(
        handle: ModelHandle,
        decoded: protocol.InferRequest,
        results: dict[str, np.ndarray[Any, Any]],
    ) -> Response:
        body, header_length = protocol.encode_infer_response(
            model_name=handle.name,
            model_version=handle.version,
            request=decoded,
            results=results,
            outputs=handle.outputs,
            labels=handle.engine.labels,
        )
        if header_length is None:
            return Response(200, body)
        return Response(
            200, body, _BINARY, [(b"inference-header-content-length", str(header_length).encode())]
        )

    @staticmethod
    def _encoded_v1(
        handle: ModelHandle,
        decoded: protocol.InferRequest,
        results: dict[str, np.ndarray[Any, Any]],
    ) -> Response:
        return Response(
            200, protocol_v1.encode_predict_response(results, handle.outputs, handle.name)
        )

    @staticmethod
    def _failure(exc: BaseException) -> Response:
        """The answer to a request that failed: its status, or a logged 500."""
        if isinstance(exc, ServeError):
            extra = list(_RETRY) if exc.status == 503 else []
            return error_response(exc.status, str(exc), extra)
        logger.error("inference failed", exc_info=exc)
        return error_response(500, f"inference failed: {type(exc).__name__}: {exc}")

    def _finish(
        self, handle: ModelHandle, response: Response, started: float, device: str = ""
    ) -> Response:
        if self._metrics_on:
            handle.engine.observe_request(
                response.status, time.perf_counter() - started, device or None
            )
        return response


def _compressed(encode: Callable[..., Response], accepted: bytes, *args: Any) -> Response:
    """``encode``'s answer in the coding ``Accept-Encoding`` weighs highest of gzip, deflate
    and identity (:func:`_chosen_coding`), as Triton compresses; as it is when that is identity.
    Either way it says ``Vary: Accept-Encoding`` (RFC 9110, 12.5.5): a cache between client and
    server must not hand one client's compressed answer to a client that cannot read it."""
    response = encode(*args)
    response.headers = [*response.headers, _VARY]
    chosen = _chosen_coding(accepted)
    if chosen is not None:
        coding, wbits = chosen
        packer = zlib.compressobj(1, zlib.DEFLATED, wbits)
        response.body = packer.compress(response.body) + packer.flush()
        response.headers.append((b"content-encoding", coding))
    return response


#: the codings an answer is compressed in, with their zlib ``wbits``: gzip first where a client
#: weighs them alike
_ANSWER_CODINGS = ((b"gzip", 16 + zlib.MAX_WBITS), (b"deflate", zlib.MAX_WBITS))
#: an entry of ``Accept-Encoding`` (lower-cased): a coding and its weight, RFC 9110 12.4.2's
#: qvalue (0 to 1, three decimals at most), if any
_WEIGHTED = re.compile(
    rb"[ \t]*([!#$%&'*+.^_`|~0-9a-z-]+)[ \t]*"  # the coding, a token
    rb"(?:;[ \t]*q=(0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?))?[ \t]*"
)


@functools.lru_cache(maxsize=32)  # clients send one value over and over: read once
def _chosen_coding(accepted: bytes) -> tuple[bytes, int] | None:
    """The coding (and its ``wbits``) that an ``Accept-Encoding`` value weighs highest of gzip,
    deflate and identity; None for identity (RFC 9110 12.5.3, as Triton's
    ``CompressionTypeUsed`` reads it). An entry whose weight does not parse is skipped, as
    Triton skips it; ``*`` weighs each coding not named; identity, unless weighed, is taken
    below any coding weighed above 0; a tie goes to gzip, then deflate, then identity."""
    weights: dict[bytes, float] = {}
    for item in accepted.lower().split(b","):
        entry = _WEIGHTED.fullmatch(item)
        if entry is not None:  # named twice: the higher weight, as Triton's reading gives it
            coding, weight = entry.groups()
            weights[coding] = max(weights.get(coding, 0.0), float(weight or 1))
    rest = weights.get(b"*", 0.0)
    chosen, top = None, 0.0
    for coding, wbits in _ANSWER_CODINGS:
        weight = weights.get(coding, rest)
        if weight > top:
            chosen, top = (coding, wbits), weight
    return chosen if top >= weights.get(b"identity", rest) else None


#: a ``Content-Encoding`` -> the coding's name and its zlib ``wbits`` (x-gzip is gzip, RFC 9110
#: 8.4.1.3; deflate is the zlib format, RFC 9110 8.4.1.2)
_CODINGS: dict[bytes, tuple[str, int]] = {
    b"gzip": ("gzip", 16 + zlib.MAX_WBITS),
    b"x-gzip": ("gzip", 16 + zlib.MAX_WBITS),
    b"deflate": ("deflate", zlib.MAX_WBITS),
}
_GZIP_MAGIC = b"\x1f\x8b"
#: the most gzip members one body may have: real ones have one, or a few (concatenated files);
#: an empty member is 20 bytes, so a body of millions of them would be inflated one by one
_MAX_GZIP_MEMBERS = 64
#: a compressed body this large or larger is inflated off the event loop (see _inflated_then)
_INFLATE_OFF_LOOP = 4 << 10
_INFLATE_STEP = 1 << 20  # input fed to the inflater at a time: what a member's end copies


def _inflate(body: bytes, coding: tuple[str, int], limit: int) -> bytes:
    """``body`` decompressed, whole: every member of a gzip body (RFC 1952), up to ``limit``
    bytes (more is :class:`PayloadTooLargeError`, found without inflating the rest). A body
    cut short (its checksum trailer missing), or with anything but zero padding after its
    end, is :class:`InputError`; so is one of more than :data:`_MAX_GZIP_MEMBERS` members."""
    name, wbits = coding
    view = memoryview(body)
    parts: list[bytes] = []
    size = position = 0
    members = 1
    inflater = zlib.decompressobj(wbits)
    while position < len(view):
        piece = view[position : position + _INFLATE_STEP]
        try:
            out = inflater.decompress(piece, limit + 1 - size)
        except zlib.error as exc:
            raise InputError(_undecodable(name, exc)) from None
        size += len(out)
        if size > limit:
            raise PayloadTooLargeError(  # Triton's words first
                f"Decompressed data size exceeds the maximum allowed value of {limit} bytes; "
                f"the decompressed body is over the limit of {limit} bytes (--max-body-bytes)"
            )
        parts.append(out)
        position += len(piece) - len(inflater.unused_data)
        if inflater.eof and position < len(view):
            if not _another_member(name, view[position:], members):
                break  # zero padding after the last member, which gzip ignores too
            members += 1
            inflater = zlib.decompressobj(wbits)
    if body and not inflater.eof:
        raise InputError(
            f"the {name} body ends before its compressed data does (it was cut short, or its "
            "checksum trailer is missing); send the whole compressed body"
        )
    return b"".join(parts)


def _another_member(name: str, rest: memoryview, members: int) -> bool:
    """What follows the end of a compressed stream of ``members`` members: another gzip member
    (True), zero padding after a gzip body (False: the body ends), or an InputError."""
    if name == "gzip":
        if rest[:2] == _GZIP_MAGIC:
            if members < _MAX_GZIP_MEMBERS:
                return True
            raise InputError(
                f"the gzip body has more than {_MAX_GZIP_MEMBERS} members; compress the body "
                "as one gzip stream"
            )
        if not rest.tobytes().strip(b"\0"):
            return False
    raise InputError(
        f"the {name} body has {len(rest)} bytes after the end of its compressed data; send "
        "the compressed body alone"
    )


def _undecodable(name: str, exc: zlib.error) -> str:
    """Why a ``name`` body does not decompress, and what the coding must be."""
    which = "the gzip format (RFC 1952)" if name == "gzip" else "the zlib format (RFC 1950)"
    return f"the {name} body does not decompress ({exc}); Content-Encoding {name} is {which}"


#: a repository index body whose ``ready`` is an array or an object
_READY_NESTED = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


def _json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (empty: an empty one)."""
    try:
        doc = protocol.json_loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise InputError(f"the body is not JSON: {exc}; send a JSON object or none") from None
    if not isinstance(doc, dict):
        raise InputError("the body must be a JSON object (or empty)")
    return doc


#: the verbs of KServe V1's model routes (``/v1/models/{name}:predict``; '': its status)
_V1_VERBS = ("", "predict", "explain")


def _wrong_method(request: Request, method: bytes) -> Response | None:
    """The 405 for a request whose method is not ``method`` (HEAD goes where GET does)."""
    if request.method == method or (request.method == b"HEAD" and method == b"GET"):
        return None
    allow = method + b", HEAD" if method == b"GET" else method
    return error_response(
        405,
        f"{request.method.decode(errors='replace')} is not allowed on "
        f"{_text(request.path)}; use {allow.decode()}",
        [(b"allow", allow)],
    )


def _asterisk(request: Request) -> Response:
    """``OPTIONS *`` asks what the server as a whole takes: the methods (RFC 9110, 9.3.7); any
    other method has no business with the asterisk-form target (RFC 9112, 3.2.4)."""
    if request.method == b"OPTIONS":
        return Response(200, b"", b"text/plain", [(b"allow", b"GET, HEAD, POST")])
    return error_response(
        400,
        f"the request target '*' is only for OPTIONS, not {_text(request.method)}; give a "
        "path, such as /v2/health/ready (see /v2/openapi.json for the routes served)",
    )


class _Answer(Ticket[Response]):
    """The answer to an inference request; cancelling it (the connection went away, or the
    request timed out) cancels the engine's work too, whose queued rows are then withdrawn,
    never run."""

    __slots__ = ("work",)

    def __init__(self, work: Ticket[Any] | asyncio.Future[Any]) -> None:
        super().__init__()
        self.work = work

    def cancel(self, msg: object = None) -> bool:
        if not super().cancel(msg):
            return False
        self.work.cancel(msg)
        return True


def _stamps(engine: Any, request: Request, started: float, request_id: str | None) -> Stamps | None:
    """A request's front-end times when its model traces in Triton's format now: read from
    its first bytes to ``started``; None otherwise (nothing is taken per request)."""
    tracer = getattr(engine, "tracer", None)
    if tracer is None or not (tracer.enabled and tracer.triton_format):
        return None
    begun = monotonic_to_perf(request.received) if request.received else started
    return Stamps("HTTP", min(begun, started), started, request_id)


def _caller(headers: dict[bytes, bytes]) -> Any:
    """The trace a request joins: its W3C ``traceparent`` header's, else the caller's
    (:data:`~torchplace.serve.tracing.CALLER`, set by a Ray Serve replica), else None."""
    parent = headers.get(b"traceparent")
    if parent is None:
        return tracing.CALLER.get()
    carrier = {"traceparent": _name(parent)}
    state = headers.get(b"tracestate")
    if state is not None:
        carrier["tracestate"] = _name(state)
    return tracing.caller_context(carrier)


def _timeout_us(headers: dict[bytes, bytes], parameter: int | None) -> int | None:
    """The request's timeout in microseconds: the shorter of its ``timeout`` parameter and
    its ``Inference-Timeout-Us`` header (0 or absent: the server default)."""
    raw = headers.get(b"inference-timeout-us")
    if raw is None:
        return parameter
    if not raw.isdigit() or len(raw) > 19 or int(raw) >= 2**63:
        raise InputError(
            f"Inference-Timeout-Us {_text(raw)!r} is not a number of microseconds; "
            "give a non-negative integer below 2**63 (0: the server default)"
        )
    given = [t for t in (int(raw), parameter) if t]
    return min(given) if given else None


def _name(raw: bytes) -> str:
    """A name (of a model, version or region) or a value the request carries, whole: what is
    looked up or passed on is never cut (:func:`_text` cuts what a message quotes)."""
    return raw.decode("utf-8", errors="replace")


def _text(raw: bytes) -> str:
    """``raw`` as a message quotes it: cut past 200 characters."""
    text = raw.decode("utf-8", errors="replace")
    return text if len(text) <= 200 else text[:200] + "..."


def _json_text(value: object) -> str:
    """A value the client sent, as JSON (``true``, not Python's ``True``), cut short."""
    return _text(orjson.dumps(value))
