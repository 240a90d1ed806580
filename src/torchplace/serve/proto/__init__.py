"""The Open Inference Protocol over gRPC, as Triton defines it (``package inference``).

``grpc_service.proto`` and ``model_config.proto`` are copied unchanged from
triton-inference-server/common (``protobuf/``, commit 83adf7cf88a2, BSD-3-Clause, their
licence kept in each file's header). ``grpc_service_pb2`` and ``model_config_pb2`` are
generated from them by ``scripts/gen-grpc-proto`` (grpcio-tools 1.81.1; a test regenerates and
compares) into torchplace's own descriptor pool, so that ``tritonclient.grpc`` can share the
process. ``health.proto`` is gRPC's health checking protocol, copied unchanged from grpc/grpc
(``src/proto/grpc/health/v1/``, Apache-2.0, its licence kept in the header); ``health_pb2`` is
generated the same way, and so is ``reflection_pb2``, from gRPC's server reflection protocol,
``reflection.proto``, copied unchanged from grpc/grpc (``src/proto/grpc/reflection/v1/``,
Apache-2.0, its licence kept in the header). Importing this package imports nothing.
"""
