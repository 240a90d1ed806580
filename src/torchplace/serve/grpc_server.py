"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``).

:class:`GrpcServer` serves the same engine as the REST app, on the same asyncio loop: a
``ModelInfer`` goes through the codec of :mod:`torchplace.serve.grpc_codec` (the REST
validation rules and messages) into :meth:`Engine.infer <torchplace.serve.engine.Engine.infer>`,
so the batcher, the replicas, deadlines, priorities and row splitting are shared. The
protocol's messages come from Triton's ``.proto`` (:mod:`torchplace.serve.proto`); the
transport is :mod:`torchplace.serve.grpc_wire` (HTTP/2 read on the loop), which runs the
handlers grpc.aio would.

RPCs: ``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``,
``ModelInfer``, ``ModelStreamInfer`` (each message a ``ModelInfer``, answered as it finishes,
with Triton's ``triton_final_response`` parameter true; a failure is the answer's
``error_message`` and the stream goes on), ``ModelConfig`` and
``ModelStatistics`` (Triton's extensions, the documents of
:mod:`torchplace.serve.triton`), and the repository extension's ``RepositoryIndex``,
``RepositoryModelLoad`` and ``RepositoryModelUnload`` (:mod:`torchplace.serve.reload`; also
served as ``inference.model_repository.ModelRepositoryService``, whose ``.proto`` KServe and
MLServer publish), and
the shared-memory extensions' ``SystemSharedMemory*`` and ``CudaSharedMemory*``
(:mod:`torchplace.serve.shm`), the logging extension's ``LogSettings``
(:mod:`torchplace.serve.log_settings`) and the trace extension's ``TraceSetting``
(:mod:`torchplace.serve.trace_settings`); any other RPC gets gRPC's own ``UNIMPLEMENTED``. The same port
serves gRPC's health checking protocol (:mod:`torchplace.serve.grpc_health`). Models are looked up by name (and version) in the
server's :class:`~torchplace.serve.registry.Registry` at each call, as the REST side does.

Errors carry the REST messages, with the status code of the HTTP status:

====  ==========================================================================
400   ``INVALID_ARGUMENT`` (also a request that does not parse as the RPC's message);
      ``ALREADY_EXISTS`` for a shared-memory region name already registered, as in Triton;
      ``RESOURCE_EXHAUSTED`` for a region past the most registered at once
401   ``UNAUTHENTICATED`` (with ``--auth-token-file``: metadata ``authorization:
      Bearer TOKEN`` on every RPC but ServerLive and ServerReady)
403   ``FAILED_PRECONDITION`` (load/unload refused by the model control mode; client shared
      memory off)
404   ``NOT_FOUND``
409   ``RESOURCE_EXHAUSTED`` (a load that would not fit in device memory)
413   ``RESOURCE_EXHAUSTED`` (too many rows; a message over ``--max-body-bytes`` gets
      gRPC's own ``RESOURCE_EXHAUSTED``)
503   ``UNAVAILABLE`` (not ready, shutting down); ``RESOURCE_EXHAUSTED`` when overloaded
504   ``DEADLINE_EXCEEDED``
507   ``RESOURCE_EXHAUSTED`` (one row does not fit in device memory)
500   ``INTERNAL``
501   ``UNIMPLEMENTED`` (a repository call naming a ``repository_name``, or a change of
      ``log_file`` or ``trace_file``, as in Triton)
====  ==========================================================================

A gRPC deadline set by the client bounds the request's queueing like the ``timeout``
parameter does; a cancelled RPC's queued work is removed, never computed.

Drain (:meth:`GrpcServer.shutdown`): readiness turns false and new ``ModelInfer`` calls get
``UNAVAILABLE`` at once; after the grace, the server stops taking RPCs and waits for the ones in
flight, within the drain timeout.

Metrics: ``torchplace_grpc_requests_total{code}`` and
``torchplace_grpc_request_duration_seconds`` (``ModelInfer`` calls, labelled ``model``,
``version``, ``device`` like every series), in the engine's registry next to the HTTP series.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import json_format

from torchplace import __version__
from torchplace.errors import (
    ConfigError,
    InputError,
    NotReadyError,
    OverloadedError,
    ServeError,
)
from torchplace.serve.app import bearer_matches
from torchplace.serve.grpc_codec import (
    decode_infer_request,
    encode_infer_response,
    parse_message,
    status_details,
    stream_response,
)
from torchplace.serve.grpc_health import (
    HEALTH,
    NOT_SERVING,
    SERVING,
    HealthNotifier,
    health_handler,
)
from torchplace.serve.grpc_read import OpenCalls, unary_unary_handler
from torchplace.serve.grpc_reflection import reflection_handlers
from torchplace.serve.grpc_wire import WireLimits, WireServer
from torchplace.serve.http import grpc_connection_limit
from torchplace.serve.log_settings import LogSettings
from torchplace.serve.proto import grpc_service_pb2 as pb
from torchplace.serve.proto import model_config_pb2 as config_pb
from torchplace.serve.repository import inline_config
from torchplace.serve.shm import (
    Region,
    SharedMemoryExistsError,
    SharedMemoryFullError,
    SharedMemoryRegions,
)
from torchplace.serve.trace_settings import TraceSettings, tracers
from torchplace.serve.triton import extensions, model_statistics
from torchplace.serve.triton_trace import Stamps, monotonic_to_perf

if TYPE_CHECKING:
    from torchplace.serve.config import ServeConfig
    from torchplace.serve.registry import ModelHandle
    from torchplace.serve.reload import ModelControl

__all__ = [
    "MAX_STREAMS_PER_CONNECTION",
    "REPOSITORY_SERVICE",
    "SERVICE",
    "GrpcServer",
    "status_code",
]

logger = logging.getLogger("torchplace.serve")

SERVICE = "inference.GRPCInferenceService"
#: the model repository extension as its own service (KServe's and MLServer's
#: ``model_repository.proto``): the same three RPCs, whose messages match Triton's on the wire
REPOSITORY_SERVICE = "inference.model_repository.ModelRepositoryService"
REPOSITORY_RPCS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
#: put on a stream's answer queue when the drain starts; compared by identity only
_DRAINING = bytes(bytearray(b"draining"))
#: how a stream the client still sends on ends once a drain answered what it read: UNAVAILABLE,
#: not OK, so that a client (tritonclient's stream callback) learns that it ended
_STREAM_DRAINED = (
    "the server is shutting down: every request this stream sent that was read has been "
    "answered; a request without an answer was never run: send it on a new stream, to another "
    "instance"
)
#: put on a stream's answer queue when it has been idle too long; compared by identity only
_IDLE = bytes(bytearray(b"idle"))
#: requests of one ModelStreamInfer stream in flight or answered but not yet sent
STREAM_WINDOW = 128
#: bytes of one stream's requests in flight and answers not yet sent, past which it is read no
#: further (at least one message of --max-body-bytes always fits): 128 requests of the largest
#: size, each answered with as much (an echoed id), would otherwise be held for a client that
#: sends without reading
STREAM_WINDOW_BYTES = 64 * 1024 * 1024
#: streams one connection may have open at once (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS): a
#: gRPC client queues its calls past it, and the server refuses a new stream (REFUSED_STREAM)
#: while this many of the connection's calls are open; a reset stream is freed at once
MAX_STREAMS_PER_CONNECTION = 4096
#: the most bytes of metadata a call may carry (gRPC core's hard limit)
_MAX_METADATA_BYTES = 16 * 1024
_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.FAILED_PRECONDITION,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.RESOURCE_EXHAUSTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
}


def status_code(exc: ServeError) -> grpc.StatusCode:
    """The gRPC status of a serving error (see the module docstring's table)."""
    if isinstance(exc, (OverloadedError, SharedMemoryFullError)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, SharedMemoryExistsError):  # a 400 over REST, as in Triton
        return grpc.StatusCode.ALREADY_EXISTS
    return _STATUS.get(exc.status, grpc.StatusCode.INTERNAL)


class _Abort(Exception):
    """End an RPC with a status code and message (turned into ``context.abort``; a message
    too long for the status trailer is cut, see :func:`status_details`)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(status_details(message))
        self.code = code


class _Served:
    """One model version as the gRPC side answers for it: its engine, its metadata and
    configuration messages (built once), its series."""

    def __init__(self, handle: ModelHandle, metrics: bool) -> None:
        engine = self.engine = handle.engine
        self.metrics = _grpc_metrics(engine) if metrics else None
        self.metadata = pb.ModelMetadataResponse(
            name=engine.name, versions=[engine.version], platform=engine.platform
        )
        for specs, field in ((handle.inputs, "inputs"), (handle.outputs, "outputs")):
            for spec in specs:
                getattr(self.metadata, field).add(
                    name=spec.name, datatype=spec.datatype, shape=list(spec.shape)
                )
        self.config = pb.ModelConfigResponse(
            config=json_format.ParseDict(handle.config_doc, config_pb.ModelConfig())
        )


class GrpcServer:
    """``inference.GRPCInferenceService`` over a server's models (see the module docstring)."""

    def __init__(
        self,
        control: ModelControl,
        config: ServeConfig,
        *,
        token: bytes | None = None,
        regions: SharedMemoryRegions | None = None,
        log_settings: LogSettings | None = None,
        trace_settings: TraceSettings | None = None,
    ) -> None:
        self.control = control
        #: the client shared-memory regions (the REST app's, when both serve)
        self.regions = regions or SharedMemoryRegions(allowed=config.allow_client_shm)
        #: Triton's logging extension (the REST app's, when both serve)
        self.log_settings = log_settings or LogSettings()
        self.trace_settings = trace_settings or TraceSettings()
        self.registry = control.registry
        self.config = config
        self.draining = False
        self.port = 0
        self._token = token or None
        self._started = False
        #: the answer queues of the open ModelStreamInfer streams (told when the drain starts)
        self._streams: set[asyncio.Queue[bytes | None]] = set()
        self._server: WireServer | None = None
        #: the calls open now that wait on their clients (bounded: see grpc_read.OpenCalls)
        self.open_calls = OpenCalls()
        self._server_meta = pb.ServerMetadataResponse(
            name="torchplace", version=__version__, extensions=extensions(config)
        )
        #: wakes the health Watch streams: told of the published models, the start, the
        #: drain; an engine's readiness (a replica lost or back) it probes while they watch
        self.health_changes = HealthNotifier(probe=self._engines_ready)
        self.registry.subscribe(self.health_changes.notify)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (0: any free port); ConfigError when it cannot bind."""
        # the bounds gRPC core would keep (see grpc_wire), and the HTTP server's timeouts:
        # a connection without a call for --keepalive-timeout is closed (GOAWAY: a client's
        # channel reconnects on its next call); a new one has --request-timeout to send its
        # preface; idle connections, a descriptor each, may not take the descriptors that
        # HTTP connections, model files and shared memory need
        limits = WireLimits(
            max_message_bytes=self.config.max_body_bytes,
            max_streams=MAX_STREAMS_PER_CONNECTION,
            max_metadata_bytes=_MAX_METADATA_BYTES,
            idle_timeout_s=self.config.keepalive_timeout_s,
            handshake_timeout_s=self.config.request_timeout_s,
            max_connections=grpc_connection_limit(),
            message_timeout_s=self.config.request_timeout_s,
        )
        health = health_handler(
            self._health, lambda: self.draining, self.health_changes,
            self.config.request_timeout_s, self.open_calls,
        )  # fmt: skip
        reflection = reflection_handlers(
            (SERVICE, HEALTH), self.config.request_timeout_s, self.open_calls
        )
        server = WireServer((*self._handlers(), health, *reflection), limits)
        try:
            bound = await server.start(host, port)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen for gRPC on {host}:{port}: {exc.strerror or exc}; give another "
                "--grpc-port (0 turns gRPC off)"
            ) from None
        self._server = server
        self.port = bound
        self._started = True
        self.health_changes.notify()

    def ready(self) -> bool:
        """Ready for inference: every loaded model is, and the server is not draining."""
        if not self._started or self.draining:
            return False
        return all(h.engine.is_ready() for h in self.registry.handles())

    async def shutdown(self, timeout: float, grace: float = 0.0) -> None:
        """Drain: refuse new inference at once, stop taking RPCs after ``grace`` seconds,
        wait for the RPCs in flight within ``timeout`` seconds of the start."""
        deadline = time.monotonic() + timeout
        self.draining = True
        self.health_changes.notify()  # the watches send NOT_SERVING and end
        for answers in self._streams:
            answers.put_nowait(_DRAINING)  # a stream ends once its requests are answered
        if grace > 0:
            await asyncio.sleep(min(grace, timeout))
        if self._server is not None:
            await self._server.stop(max(0.0, deadline - time.monotonic()))

    def _engines_ready(self) -> tuple[bool, ...]:
        """Each loaded version's readiness (what the health notifier probes)."""
        return tuple(h.engine.is_ready() for h in self.registry.handles())

    def _health(self, service: str) -> int | None:
        """The health protocol's status of the server ('' or the OIP service) or of a model
        (by name); None for any other name."""
        if service in ("", SERVICE):
            return SERVING if self.ready() else NOT_SERVING
        try:
            handle = self.registry.get(service, "")
        except ServeError:
            return None
        up = self._started and not self.draining and handle.engine.is_ready()
        return SERVING if up else NOT_SERVING

    async def close(self) -> None:
        """Stop at once (failed start-up)."""
        if self._server is not None:
            await self._server.stop(None)

    # -- routing ---------------------------------------------------------------------------
    def _handlers(self) -> tuple[grpc.GenericRpcHandler, grpc.GenericRpcHandler]:
        rpcs: dict[str, tuple[Callable[..., Awaitable[Any]], Any, bool]] = {
            "ServerLive": (self._server_live, pb.ServerLiveRequest, True),
            "ServerReady": (self._server_ready, pb.ServerReadyRequest, True),
            "ModelReady": (self._model_ready, pb.ModelReadyRequest, False),
            "ServerMetadata": (self._server_metadata, pb.ServerMetadataRequest, False),
            "ModelMetadata": (self._model_metadata, pb.ModelMetadataRequest, False),
            "ModelConfig": (self._model_config_rpc, pb.ModelConfigRequest, False),
            "ModelStatistics": (self._model_statistics, pb.ModelStatisticsRequest, False),
            "RepositoryIndex": (self._repository_index, pb.RepositoryIndexRequest, False),
            "RepositoryModelLoad": (self._repository_load, pb.RepositoryModelLoadRequest, False),
            "RepositoryModelUnload": (
                self._repository_unload,
                pb.RepositoryModelUnloadRequest,
                False,
            ),
            **self._shared_memory_rpcs(),
            "TraceSetting": (self._trace_setting, pb.TraceSettingRequest, False),
            "LogSettings": (self._log_settings, pb.LogSettingsRequest, False),
        }
        # requests arrive as bytes and are parsed in the RPC: a message that does not parse
        # is the client's error (INVALID_ARGUMENT), not grpcio's UNKNOWN
        # and each request message must arrive within the request timeout (grpc_read)
        timeout_s, calls = self.config.request_timeout_s, self.open_calls
        handlers = {
            name: unary_unary_handler(self._guarded(fn, message, public), timeout_s, calls)
            for name, (fn, message, public) in rpcs.items()
        }
        handlers["ModelInfer"] = unary_unary_handler(self._model_infer, timeout_s, calls)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self._model_stream_infer
        )
        repository = {name: handlers[name] for name in REPOSITORY_RPCS}
        return (
            grpc.method_handlers_generic_handler(SERVICE, handlers),
            grpc.method_handlers_generic_handler(REPOSITORY_SERVICE, repository),
        )

    def _guarded(
        self, fn: Callable[[Any, Any], Awaitable[Any]], message: Any, public: bool
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]]:
        """The RPC with its request parsed, the bearer-token check and :class:`_Abort` turned
        into a status."""

        async def rpc(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            try:
                if self._token is not None and not public:
                    self._check_auth(context)
                response = await fn(_parsed(message, data), context)
            except _Abort as exc:
                await context.abort(exc.code, str(exc))
            serialized: bytes = response.SerializeToString()
            return serialized

        return rpc

    def _check_auth(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        assert self._token is not None
        given = [
            value.encode() if isinstance(value, str) else value
            for key, value in context.invocation_metadata() or ()
            if key == "authorization"
        ]
        # one token, as over HTTP: a repeated header is refused whatever its values say
        if len(given) != 1 or not bearer_matches(given[0], self._token):
            why = "missing" if not given else "repeated" if len(given) > 1 else "wrong"
            raise _Abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{why} bearer token; send metadata 'authorization: Bearer TOKEN'",
            )

    def _handle(self, name: str, version: str) -> ModelHandle:
        """The model ``name`` (at ``version``, '' = the latest); NOT_FOUND else."""
        try:
            return self.registry.get(name, version)
        except ServeError as exc:
            raise _Abort(status_code(exc), str(exc)) from None

    def _model(self, name: str, version: str) -> _Served:
        """The gRPC view of the model ``name`` (at ``version``, '' = the latest)."""
        return self._served(self._handle(name, version))

    def _served(self, handle: ModelHandle) -> _Served:
        """The gRPC view of a model version (its messages built once)."""
        served: _Served | None = handle.views.get("grpc")
        if served is None:
            served = handle.views["grpc"] = _Served(handle, self.config.metrics)
        return served

    # -- RPCs ------------------------------------------------------------------------------
    async def _server_live(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def _server_ready(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.ready())

    async def _model_ready(self, request: Any, context: Any) -> Any:
        """Ready or not; a model (or version) not loaded is not ready, not an error, as in
        Triton (``tritonclient``'s ``is_model_ready`` is then False, as over REST)."""
        try:
            handle = self.registry.get(request.name, request.version)
        except ServeError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.ready() and handle.engine.is_ready())

    async def _log_settings(self, request: Any, context: Any) -> Any:
        """Triton's logging extension: change the settings the request names (none: read)."""
        changes = {name: _parameter_value(value) for name, value in request.settings.items()}
        try:
            settings = self.log_settings.update(changes)
        except ServeError as exc:
            raise _Abort(status_code(exc), str(exc)) from None
        response = pb.LogSettingsResponse()
        for name, value in settings.items():
            field = {bool: "bool_param", int: "uint32_param"}.get(type(value), "string_param")
            setattr(response.settings[name], field, value)
        return response

    async def _trace_setting(self, request: Any, context: Any) -> Any:
        """Triton's trace extension: change the settings the request names (none: read), the
        server's or ``model_name``'s."""
        model = request.model_name or None
        found = tracers(self.registry)
        if model is not None:
            self._handle(model, "")  # NOT_FOUND for a model not loaded
        changes = {name: list(value.value) or None for name, value in request.settings.items()}
        try:
            settings = self.trace_settings.update(changes, found, model)
        except ServeError as exc:
            raise _Abort(status_code(exc), str(exc)) from None
        response = pb.TraceSettingResponse()
        for name, value in settings.items():
            response.settings[name].value.extend(value if isinstance(value, list) else [value])
        return response

    async def _server_metadata(self, request: Any, context: Any) -> Any:
        return self._server_meta

    async def _model_metadata(self, request: Any, context: Any) -> Any:
        handle = self._handle(request.name, request.version)
        metadata = pb.ModelMetadataResponse()
        metadata.CopyFrom(self._served(handle).metadata)
        metadata.versions[:] = handle.versions  # every published version, as over REST
        return metadata

    async def _model_config_rpc(self, request: Any, context: Any) -> Any:
        return self._model(request.name, request.version).config

    async def _model_statistics(self, request: Any, context: Any) -> Any:
        if not request.name:
            engines = [handle.engine for handle in self.registry.handles()]
        elif request.version:
            engines = [self._model(request.name, request.version).engine]
        else:  # every loaded version, as REST's .../stats and Triton answer
            handles = self.registry.versions(request.name)
            engines = [h.engine for h in handles or [self._handle(request.name, "")]]
        return json_format.ParseDict(model_statistics(engines), pb.ModelStatisticsResponse())

    async def _repository_index(self, request: Any, context: Any) -> Any:
        _one_repository(request)
        entries = self.registry.index(request.ready, self.control.repository_models())
        return json_format.ParseDict({"models": entries}, pb.RepositoryIndexResponse())

    async def _repository_load(self, request: Any, context: Any) -> Any:
        _one_repository(request)
        # each value as it was sent (a config that is not a string_param is refused by name)
        parameters = {k: _parameter_value(v) for k, v in request.parameters.items()}
        try:
            inline = inline_config({"parameters": parameters}, request.model_name)
        except ConfigError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except ServeError as exc:  # a load Triton fails as an internal error
            raise _Abort(status_code(exc), str(exc)) from None
        await self._control(self.control.load(request.model_name, inline))
        return pb.RepositoryModelLoadResponse()

    async def _repository_unload(self, request: Any, context: Any) -> Any:
        _one_repository(request)
        given = request.parameters.get("unload_dependents")
        if given is not None and given.WhichOneof("parameter_choice") != "bool_param":
            raise _Abort(  # Triton's words
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid value type for 'unload_dependents' parameter, expected bool_param; "
                "send it as bool_param (tritonclient: unload_model(name, unload_dependents=True))",
            )
        # a model here has no dependents: either value unloads it alone
        await self._control(self.control.unload(request.model_name))
        return pb.RepositoryModelUnloadResponse()

    def _shared_memory_rpcs(self) -> dict[str, tuple[Callable[..., Awaitable[Any]], Any, bool]]:
        """The shared-memory extensions' RPCs (:mod:`torchplace.serve.shm`)."""
        regions = self.regions

        async def status(request: Any, context: Any) -> Any:
            found = _shm_call(regions.status, request.name or None)
            response = pb.SystemSharedMemoryStatusResponse()
            for entry in found:
                response.regions[entry["name"]].CopyFrom(
                    pb.SystemSharedMemoryStatusResponse.RegionStatus(**entry)
                )
            return response

        async def register(request: Any, context: Any) -> Any:
            _shm_call(regions.register, request.name, request.key, request.offset,
                      request.byte_size)  # fmt: skip
            return pb.SystemSharedMemoryRegisterResponse()

        async def unregister(request: Any, context: Any) -> Any:
            _shm_call(regions.unregister, request.name or None)
            return pb.SystemSharedMemoryUnregisterResponse()

        async def cuda_status(request: Any, context: Any) -> Any:
            _shm_call(regions.cuda_status, request.name or None)
            return pb.CudaSharedMemoryStatusResponse()

        async def cuda_register(request: Any, context: Any) -> Any:
            _shm_call(regions.cuda_register, request.name)
            return pb.CudaSharedMemoryRegisterResponse()

        async def cuda_unregister(request: Any, context: Any) -> Any:
            _shm_call(regions.cuda_unregister)
            return pb.CudaSharedMemoryUnregisterResponse()

        return {
            "SystemSharedMemoryStatus": (status, pb.SystemSharedMemoryStatusRequest, False),
            "SystemSharedMemoryRegister": (register, pb.SystemSharedMemoryRegisterRequest, False),
            "SystemSharedMemoryUnregister": (
                unregister, pb.SystemSharedMemoryUnregisterRequest, False),
            "CudaSharedMemoryStatus": (cuda_status, pb.CudaSharedMemoryStatusRequest, False),
            "CudaSharedMemoryRegister": (
                cuda_register, pb.CudaSharedMemoryRegisterRequest, False),
            "CudaSharedMemoryUnregister": (
                cuda_unregister, pb.CudaSharedMemoryUnregisterRequest, False),
        }  # fmt: skip

    @staticmethod
    async def _control(action: Awaitable[None]) -> None:
        try:
            await action
        except ServeError as exc:
            raise _Abort(status_code(exc), str(exc)) from None
        except ConfigError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None

    async def _model_infer(self, data: bytes, context: Any) -> bytes:
        """ModelInfer, the hot path: the bearer token, then :meth:`_answer`; an
        :class:`_Abort` is the RPC's status."""
        try:
            if self._token is not None:
                self._check_auth(context)
            return await self._answer(_parsed(pb.ModelInferRequest, data), context, True)
        except _Abort as exc:
            await context.abort(exc.code, str(exc))
            raise  # not reached: abort raises

    async def _model_stream_infer(
        self, requests: AsyncIterator[bytes], context: Any
    ) -> AsyncIterator[bytes]:
        """ModelStreamInfer: every message on the stream is a ModelInfer, run as it arrives;
        answers come back as they finish (``infer_response.id`` tells which), a failed
        request's as ``error_message``, and the stream goes on. At most :data:`STREAM_WINDOW`
        requests, and about :data:`STREAM_WINDOW_BYTES`, are in flight or unsent (the client
        is read no further meanwhile); requests still running when the stream ends are
        withdrawn. When the server drains, the stream ends once its requests are answered
        (UNAVAILABLE unless the client had half-closed it: more may be on the way). A
        stream with nothing in flight that receives no request for ``--keepalive-timeout`` (an
        idle client, or one that stalled part-way through a message) ends with
        ``DEADLINE_EXCEEDED``, as an idle HTTP connection is closed."""
        if self._token is not None:
            try:
                self._check_auth(context)
            except _Abort as exc:
                await context.abort(exc.code, str(exc))
        answers: asyncio.Queue[bytes | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        # a request holds a slot until its answer is sent: a client that sends without reading
        # is read no further once STREAM_WINDOW answers wait (HTTP/2 flow control holds it);
        # the same once their bytes are over the byte window
        slots = asyncio.Semaphore(STREAM_WINDOW)
        limit = max(STREAM_WINDOW_BYTES, self.config.max_body_bytes)
        held = [0]  # bytes of the requests in flight and of the answers not sent
        half_closed = [False]  # the client said it sends no more
        room = asyncio.Event()
        room.set()
        loop = asyncio.get_running_loop()
        idle_s = self.config.keepalive_timeout_s
        last = [loop.time()]  # when a request last arrived or an answer was ready

        def idle_check() -> None:
            quiet = loop.time() - last[0]
            if running or quiet < idle_s:
                delay = idle_s if running else max(idle_s - quiet, 0.1)
                timer[0] = loop.call_later(delay, idle_check)
            else:
                answers.put_nowait(_IDLE)  # answers not yet sent go first

        timer = [loop.call_later(idle_s, idle_check)]

        def hold(size: int) -> None:
            held[0] += size
            if held[0] > limit:
                room.clear()
            else:
                room.set()

        async def one(data: bytes) -> None:
            # as Triton says on a stream: every answer, a failure's too, is its request's last
            # (a client that asked for triton_enable_empty_final_response counts the request
            # done on reading it)
            request = None
            try:
                request = _parsed(pb.ModelInferRequest, data)
                serialized = stream_response(await self._answer(request, context, final=True))
            except _Abort as exc:
                answer = pb.ModelStreamInferResponse(error_message=str(exc))
                if request is not None:  # which request failed
                    answer.infer_response.id = request.id
                answer.infer_response.parameters["triton_final_response"].bool_param = True
                serialized = answer.SerializeToString()
            hold(len(serialized) - len(data))
            answers.put_nowait(serialized)
            last[0] = loop.time()

        async def read() -> None:
            async for data in requests:
                last[0] = loop.time()
                await slots.acquire()
                await room.wait()
                hold(len(data))
                task = asyncio.ensure_future(one(data))
                running.add(task)
                task.add_done_callback(running.discard)
            half_closed[0] = True
            while running:
                await asyncio.wait(set(running))
            answers.put_nowait(None)

        reader = asyncio.ensure_future(read())
        self._streams.add(answers)
        # quiet while it waits for a request: nothing to compute, no answer to send
        counted = self.open_calls.enter(lambda: None if running or not answers.empty() else last[0])
        try:
            if counted.reason is not None:
                await counted.abort(context)
            while (answer := await answers.get()) is not None:
                if answer is _IDLE:
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"stream idle: no request for {idle_s:g} s and none in flight "
                        "(--keepalive-timeout); start a new stream to send more",
                    )
                if answer is not _DRAINING:
                    yield answer
                    slots.release()
                    hold(-len(answer))
                # drained while the client may still send (not half-closed): not an OK end
                drained = self.draining and answers.empty() and all(t.done() for t in running)
                if drained and not half_closed[0]:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, _STREAM_DRAINED)
            await reader  # its error, if any, ends the stream
        except asyncio.CancelledError:
            if counted.reason is None:
                raise  # the client went away, or the server is stopping
            await counted.abort(context)  # ended to make room for other calls
        finally:
            self.open_calls.leave(counted)
            timer[0].cancel()
            self._streams.discard(answers)
            for task in (reader, *running):
                task.cancel()

    async def _answer(
        self, request: Any, context: Any, unary: bool = False, *, final: bool = False
    ) -> bytes:
        """One inference request to its serialized ``ModelInferResponse`` (the model,
        :meth:`_infer`, its series); :class:`_Abort` once the call is counted. ``unary``: the
        call's one request (a ModelInfer, not a stream's), timed by its front end when traced;
        ``final``: the answer says it is the request's last (a stream's)."""
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        served: _Served | None = None
        handle: ModelHandle | None = None
        try:
            handle = self._handle(request.model_name, request.model_version).enter()
            served = self._served(handle)
            stamps = _stamps(handle.engine, context, started, request.id) if unary else None
            response = await self._infer(handle, request, context, stamps, final)
            if stamps is not None:  # made: its send (serialized, written) starts
                stamps.send_start = time.perf_counter()
            return response
        except _Abort as exc:
            code = exc.code
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            if handle is not None:
                handle.leave()
            if served is not None and served.metrics is not None:
                served.metrics.observe(code, time.perf_counter() - started)

    async def _infer(
        self,
        handle: ModelHandle,
        request: Any,
        context: Any,
        stamps: Stamps | None = None,
        final: bool = False,
    ) -> bytes:
        held: tuple[Region, ...] = ()  # the shared-memory regions it named, until answered
        engine = handle.engine
        try:
            if self.draining:
                raise NotReadyError("the server is shutting down; retry elsewhere")
            decoded, held = self.regions.holding(
                decode_infer_request,
                request,
                inputs=handle.inputs,
                outputs=handle.outputs,
                max_rows=handle.max_request_rows,
                allow_nan=self.config.allow_nan,
                regions=self.regions,
                model=engine.name,
            )
            timeout_s = decoded.timeout_us / 1e6 if decoded.timeout_us else None
            remaining = context.time_remaining()
            if remaining is not None and (timeout_s is None or remaining < timeout_s):
                timeout_s = max(remaining, 1e-6)
            results = await engine.infer(
                handle.one_request(decoded.inputs),
                timeout_s=timeout_s,
                priority=decoded.priority,
                stamps=stamps,
            )
            return encode_infer_response(
                model_name=engine.name,
                model_version=engine.version,
                request=decoded,
                results=handle.its_answer(results),
                outputs=handle.outputs,
                labels=engine.labels,
                final=final,
            )
        except ServeError as exc:
            raise _Abort(status_code(exc), str(exc)) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("inference failed")
            raise _Abort(
                grpc.StatusCode.INTERNAL, f"inference failed: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            self.regions.release(held)


def _stamps(engine: Any, call: Any, read: float, request_id: str) -> Stamps | None:
    """A unary call's front-end times when its model traces in Triton's format now: from the
    call's opening to ``read`` (its message read and parsed); its send is timed from now to
    the call's end (see :meth:`GrpcServer._answer`). None otherwise (nothing is taken per
    call)."""
    tracer = getattr(engine, "tracer", None)
    opened = getattr(call, "opened", None)
    if tracer is None or opened is None or not (tracer.enabled and tracer.triton_format):
        return None
    stamps = Stamps("GRPC", min(monotonic_to_perf(opened), read), read, request_id or None)

    def ended(sent: bool) -> None:
        if sent and stamps.send_start is not None:
            stamps.sent(stamps.send_start, time.perf_counter())
        else:
            stamps.abandoned()

    call.on_end = ended
    return stamps


def _one_repository(request: Any) -> None:
    """Refuse a repository call that names a repository, as Triton does (this server has one,
    ``--model-repository``)."""
    if request.repository_name:
        raise _Abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "'repository_name' specification is not supported; leave it empty (this server "
            "serves one repository, its --model-repository)",
        )


def _parameter_value(parameter: Any) -> object:
    """A ``ModelRepositoryParameter``'s value, of the type it was sent as (None if unset)."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def _shm_call(fn: Callable[..., Any], *args: Any) -> Any:
    """A call into the shared-memory regions, its error the RPC's status."""
    try:
        return fn(*args)
    except ServeError as exc:
        raise _Abort(status_code(exc), str(exc)) from None


def _parsed(message: Any, data: bytes) -> Any:
    """``data`` parsed as a ``message``; INVALID_ARGUMENT when it is not one."""
    try:
        return parse_message(message, data)
    except InputError as exc:
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None


class _GrpcMetrics:
    """``torchplace_grpc_*`` series of one engine, exposed from its registry."""

    def __init__(self, engine: Any) -> None:
        from torchplace.serve.metrics import FOLD_AT, FastHistogram

        self.engine = engine
        self._histogram = FastHistogram
        self._fold_at = FOLD_AT
        self._served_by: Callable[[], str] = getattr(engine, "served_by", lambda: "")
        self.durations: dict[str, FastHistogram] = {}
        self.by_code: dict[tuple[str, str], int] = {}  # (device, code) -> count
        #: finished calls not yet counted (their device, code and seconds), appended on the
        #: event loop and folded in by a scrape (also on the loop) or once FOLD_AT wait, as
        #: the REST requests' series are: three appends cost a third of a bucket search and
        #: a lock, and make no object the garbage collector must follow
        self._devices: list[str] = []
        self._codes: list[grpc.StatusCode] = []
        self._seconds: list[float] = []

    def observe(self, code: grpc.StatusCode, seconds: float) -> None:
        self._devices.append(self._served_by())
        self._codes.append(code)
        self._seconds.append(seconds)
        if len(self._seconds) >= self._fold_at:
            self._fold()

    def _fold(self) -> None:
        devices, codes, seconds = self._devices, self._codes, self._seconds
        if not seconds:
            return
        self._devices, self._codes, self._seconds = [], [], []
        by_device: dict[str, list[float]] = {}
        for device, code, took in zip(devices, codes, seconds, strict=True):
            by_device.setdefault(device, []).append(took)
            key = (device, code.name)
            self.by_code[key] = self.by_code.get(key, 0) + 1
        for device, took_all in by_device.items():
            duration = self.durations.get(device)
            if duration is None:
                duration = self.durations.setdefault(device, self._histogram(_BUCKETS))
            duration.observe_many(took_all)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        self._fold()
        labels = ["model", "version", "device"]
        model, version = self.engine.name, self.engine.version
        requests = CounterMetricFamily(
            "torchplace_grpc_requests",
            "gRPC ModelInfer calls answered, by gRPC status code.",
            labels=[*labels, "code"],
        )
        counts = sorted(self.by_code.items())
        for (device, code), count in counts:
            requests.add_metric([model, version, device, code], float(count))
        duration = HistogramMetricFamily(
            "torchplace_grpc_request_duration_seconds",
            "Time from a ModelInfer call's arrival to its answer, in seconds.",
            labels=labels,
        )
        for device, histogram in sorted(self.durations.items()):
            buckets, total = histogram.snapshot()
            duration.add_metric([model, version, device], buckets, total)
        yield requests
        yield duration

    def describe(self) -> list[Any]:
        return []


_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5, 5.0, 10.0, 30.0)  # fmt: skip


def _grpc_metrics(engine: Any) -> _GrpcMetrics | None:
    """The gRPC series, registered in the engine's registry (None: the engine keeps none)."""
    registry = getattr(getattr(engine, "metrics", None), "registry", None)
    if registry is None:
        return None
    metrics = _GrpcMetrics(engine)
    registry.register(metrics)
    return metrics
