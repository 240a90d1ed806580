"""The gRPC limit: torchplace's own gRPC transport (:mod:`torchplace.serve.grpc_wire`, on
uvloop when installed, as torchplace runs it) with nothing behind it but one fixed response to
every ``ModelInfer``, whatever it asks. No decoding, no batching, no model: what one unary Open
Inference Protocol call costs at least on that transport on this machine. It also answers what perf_analyzer asks before it starts (server and
model metadata, the model configuration, statistics), and serves the constant HTTP reply of
``const_reply.py`` on a second port, where the benchmark checks that it is up.

Called as ``const_grpc.py GRPC_PORT HTTP_PORT MODEL REPLY_FILE``: the reply file is the REST
answer (JSON) of the model, whose numbers also make the gRPC answer.

``const_grpc.py GRPC_PORT HTTP_PORT MODEL REPLY_FILE lean DEVICE THREADS`` is the lean gRPC
reference instead: ``ModelInfer`` runs the model, its calls batched as ``lean_batcher.py``
batches (32 rows, or 2 ms after the first, as torchplace's defaults), the forward on the loop.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from const_reply import ConstantReply, http_reply

from torchplace.models import embedded_model
from torchplace.serve.grpc_wire import WireLimits, WireServer
from torchplace.serve.proto import grpc_service_pb2 as pb
from torchplace.serve.proto import model_config_pb2 as config_pb

SERVICE = "inference.GRPCInferenceService"


def answers(model: str, reply: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """RPC name -> (its fixed answer message, its request message class)."""
    spec = embedded_model(model)
    metadata = pb.ModelMetadataResponse(name=model, versions=["1"], platform="pytorch")
    config = config_pb.ModelConfig(name=model, max_batch_size=32)
    for specs, meta_field, config_field in (
        (spec.inputs, metadata.inputs, config.input),
        (spec.outputs, metadata.outputs, config.output),
    ):
        for tensor in specs:
            meta_field.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
            config_field.add(
                name=tensor.name,
                data_type=config_pb.DataType.Value(f"TYPE_{tensor.datatype}"),
                dims=list(tensor.shape[1:]),
            )
    out = reply["outputs"][0]
    infer = pb.ModelInferResponse(model_name=model, model_version="1", id="1")
    infer.outputs.add(name=out["name"], datatype=out["datatype"], shape=out["shape"])
    infer.raw_output_contents.append(np.asarray(out["data"], np.float32).tobytes())
    return {
        "ServerLive": (pb.ServerLiveResponse(live=True), pb.ServerLiveRequest),
        "ServerReady": (pb.ServerReadyResponse(ready=True), pb.ServerReadyRequest),
        "ModelReady": (pb.ModelReadyResponse(ready=True), pb.ModelReadyRequest),
        "ServerMetadata": (pb.ServerMetadataResponse(name="constant"), pb.ServerMetadataRequest),
        "ModelMetadata": (metadata, pb.ModelMetadataRequest),
        "ModelConfig": (pb.ModelConfigResponse(config=config), pb.ModelConfigRequest),
        "ModelStatistics": (pb.ModelStatisticsResponse(), pb.ModelStatisticsRequest),
        "ModelInfer": (infer, pb.ModelInferRequest),
    }


def lean_infer(model: str, device: str, threads: int) -> Callable[[Any, Any], Any]:
    """``ModelInfer`` through the model, batched (see the module docstring)."""
    import torch
    from lean_batcher import Batch

    from torchplace.models import build_model

    torch.set_num_threads(threads)
    batch = Batch(build_model(model).to(device), torch.device(device), max_delay_s=0.002)

    async def rpc(request: Any, context: Any) -> bytes:
        rows = np.frombuffer(request.raw_input_contents[0], dtype=np.float32)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        batch.add(rows.reshape(request.inputs[0].shape[0], -1), future.set_result)
        out = await future
        answer = pb.ModelInferResponse(model_name=model, model_version="1", id=request.id)
        answer.outputs.add(name="output", datatype="FP32", shape=list(out.shape))
        answer.raw_output_contents.append(out.tobytes())
        return answer.SerializeToString()

    return rpc


def constant(body: bytes) -> Callable[[Any, Any], Any]:
    async def rpc(request: Any, context: Any) -> bytes:
        return body

    return rpc


async def serve(
    grpc_port: int, http_port: int, model: str, reply: bytes, lean: tuple[str, int] | None
) -> None:
    fixed = answers(model, json.loads(reply))
    rpcs = {name: constant(message.SerializeToString()) for name, (message, _) in fixed.items()}
    if lean is not None:
        rpcs["ModelInfer"] = lean_infer(model, *lean)
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            rpcs[name], request_deserializer=request.FromString
        )
        for name, (_, request) in fixed.items()
    }
    limits = WireLimits(max_message_bytes=64 * 1024 * 1024)
    server = WireServer((grpc.method_handlers_generic_handler(SERVICE, handlers),), limits)
    await server.start("127.0.0.1", grpc_port)
    loop = asyncio.get_running_loop()
    whole = http_reply(reply)
    http = await loop.create_server(lambda: ConstantReply(whole), "127.0.0.1", http_port)
    async with http:
        await http.serve_forever()


def main() -> None:
    grpc_port, http_port, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    reply = Path(sys.argv[4]).read_bytes()
    lean = (sys.argv[6], int(sys.argv[7])) if sys.argv[5:6] == ["lean"] else None
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(grpc_port, http_port, model, reply, lean))
    else:
        uvloop.run(serve(grpc_port, http_port, model, reply, lean))


if __name__ == "__main__":
    main()
