"""gRPC's server reflection protocol, ``grpc.reflection.v1.ServerReflection`` (and its older name,
``grpc.reflection.v1alpha.ServerReflection``), on the gRPC port.

What ``grpcurl``, ``grpcui``, Postman and Evans ask before a call when they are given no
``.proto`` file (and grpcio-reflection's ``ProtoReflectionDescriptorDatabase``): the services,
and the ``FileDescriptorProto`` of the file that defines a service or message, with the files it
imports. The answers come from torchplace's own descriptor pool (:mod:`torchplace.serve.proto`):
the services listed are those whose definitions it holds, so that a client can describe and call
each one it sees. Both names of the service answer alike (their messages are the same on the
wire). A request for a name the pool does not hold is answered on the stream with an
``error_response`` (``NOT_FOUND``), as gRPC's own implementations do, the name quoted cut to
200 characters (the request is echoed whole in ``original_request`` already); the stream stays
open. No bearer token is asked for: what it tells is the published protocol, nothing of the
models.

Each request message must arrive within the request timeout, and an open stream is counted
with the calls that wait on their clients (:mod:`torchplace.serve.grpc_read`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from google.protobuf.descriptor import FileDescriptor

from torchplace.errors import InputError
from torchplace.serve.grpc_codec import parse_message
from torchplace.serve.grpc_read import OpenCalls, read_next
from torchplace.serve.proto import _pool
from torchplace.serve.proto import reflection_pb2 as reflection
from torchplace.serve.protocol import shown

__all__ = ["REFLECTION", "REFLECTION_V1ALPHA", "reflection_handlers"]

REFLECTION = "grpc.reflection.v1.ServerReflection"
REFLECTION_V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
_NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
_INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


def reflection_handlers(
    services: Sequence[str], request_timeout_s: float = 30.0, calls: OpenCalls | None = None
) -> tuple[grpc.GenericRpcHandler, ...]:
    """``ServerReflectionInfo`` under both service names, listing those of ``services`` that
    the descriptor pool defines (and the reflection service itself); each request message
    must arrive within ``request_timeout_s`` seconds, and the stream is counted in ``calls``."""
    listed = [name for name in (*services, REFLECTION) if _defined(name)]

    async def info(requests: Any, context: Any) -> AsyncIterator[bytes]:
        while (data := await read_next(context, request_timeout_s, calls)) is not None:
            try:
                request = parse_message(reflection.ServerReflectionRequest, data)
            except InputError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            yield answer(request, listed).SerializeToString()

    method = {"ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(info)}
    return tuple(
        grpc.method_handlers_generic_handler(name, method)
        for name in (REFLECTION, REFLECTION_V1ALPHA)
    )


def answer(request: Any, services: Sequence[str]) -> Any:
    """The ``ServerReflectionResponse`` to one ``ServerReflectionRequest``."""
    response = reflection.ServerReflectionResponse(valid_host=request.host)
    response.original_request.CopyFrom(request)
    kind = request.WhichOneof("message_request")
    if kind == "list_services":
        response.list_services_response.service.extend(
            reflection.ServiceResponse(name=name) for name in services
        )
    elif kind in ("file_by_filename", "file_containing_symbol"):
        name = getattr(request, kind)
        found = _file(kind, name)
        if found is None:
            what = "file" if kind == "file_by_filename" else "symbol"
            _error(response, _NOT_FOUND, f"no {what} {shown(name)} here; list the services first")
        else:
            response.file_descriptor_response.file_descriptor_proto.extend(_with_imports(found))
    elif kind == "all_extension_numbers_of_type":
        _extension_numbers(response, request.all_extension_numbers_of_type)
    elif kind == "file_containing_extension":
        wanted = request.file_containing_extension
        _error(
            response,
            _NOT_FOUND,
            f"no extension {wanted.extension_number} of {shown(wanted.containing_type)}: the "
            "protocol's messages have none",
        )
    else:
        _error(
            response,
            _INVALID_ARGUMENT,
            "the request asks for nothing; set one of list_services, file_by_filename, "
            "file_containing_symbol, file_containing_extension, all_extension_numbers_of_type",
        )
    return response


def _defined(symbol: str) -> bool:
    return _file("file_containing_symbol", symbol) is not None


def _file(kind: str, name: str) -> FileDescriptor | None:
    """The pool's file of that name (``file_by_filename``) or that defines ``name`` (a
    message, enum, service, or a service's method, which the pool's own look-up misses)."""
    pool = _pool.POOL
    try:
        if kind == "file_by_filename":
            return pool.FindFileByName(name)
        return pool.FindFileContainingSymbol(name)
    except KeyError:
        pass
    try:
        return pool.FindMethodByName(name).containing_service.file
    except KeyError:
        return None


def _with_imports(file: FileDescriptor) -> list[bytes]:
    """``file``'s serialized ``FileDescriptorProto`` and those of all it imports, itself
    first (what a client needs to build the file's descriptors)."""
    order, seen = [file], {file.name}
    for current in order:
        for dependency in current.dependencies:
            if dependency.name not in seen:
                seen.add(dependency.name)
                order.append(dependency)
    return [entry.serialized_pb for entry in order]


def _extension_numbers(response: Any, type_name: str) -> None:
    try:
        message = _pool.POOL.FindMessageTypeByName(type_name)
    except KeyError:
        _error(response, _NOT_FOUND, f"no message type {shown(type_name)} here")
        return
    numbers = response.all_extension_numbers_response
    numbers.base_type_name = message.full_name
    numbers.extension_number.extend(ext.number for ext in _pool.POOL.FindAllExtensions(message))


def _error(response: Any, code: int, message: str) -> None:
    response.error_response.error_code = code
    response.error_response.error_message = message
