"""``torchplace serve``: a model behind the Open Inference Protocol (KServe v2 REST).

What each module is for, along the path of a request:

===================  ===============================================================================
``cli``              the ``torchplace serve`` flags, and running it from the command line
``config``           :class:`ServeConfig`: every setting, validated; from flags and TOML/JSON files
``running``          :func:`serve` until SIGTERM, then drain; :class:`ServerThread` for tests
``http``             the HTTP/1.1 server on asyncio + httptools (connections, timeouts)
``listener``         closing the listening socket without resetting what the kernel accepted
``routes``           the routes and error statuses, declared once
``app``              :class:`App`: the routes over the served models (decode, run, encode, drain)
``registry``         the live set of models and versions, switched in one step
``reload``           loading, reloading and unloading models while serving (model control modes)
``repository``       the model repository on disk: config.toml (or Triton's config.pbtxt), versions
``triton_config``    Triton's ``ModelConfig`` (config.pbtxt, inline JSON) read as a model's settings
``memory``           the memory check before a load (weights + activation peak vs free/budget)
``protocol``         the OIP codec: request bodies to validated arrays, outputs to response bodies
``protocol_v1``      KServe's V1 protocol (``:predict``), read as the OIP request it stands for
``shm``              Triton's system shared memory: client regions mapped, tensors read and written
``classification``   Triton's classification extension: an output as its top classes
``messages``         the OIP messages as JSON Schema
``openapi``          the ``/v2/openapi.json`` document, derived from ``routes`` and ``messages``
``grpc_server``      the same protocol over gRPC (on the same loop, into the same engine)
``grpc_wire``        gRPC's transport: HTTP/2 connections read and written on the loop, their limits
``grpc_call``        one gRPC call: its messages' framing, compression, the handlers' context
``h2frames``         the HTTP/2 frames and HPACK header blocks the transport writes
``grpc_codec``       ``ModelInferRequest`` to validated arrays and back (the REST rules, messages)
``grpc_read``        reading a gRPC call's request message within a time limit
``grpc_health``      gRPC's standard health checking service (``grpc.health.v1.Health``)
``grpc_reflection``  gRPC's server reflection (what grpcurl asks when given no ``.proto``)
``proto``            the ``.proto`` files (Triton's, gRPC's) and the modules generated from them
``triton``           Triton's model configuration and statistics documents (REST and gRPC)
``statistics``       the counts and nanoseconds behind Triton's statistics
``datatypes``        OIP datatypes <-> numpy and torch dtypes
``engine``           :class:`Engine`: routing and lifecycle of one model version
``ticket``           a request's settle-once result, its callbacks run in the call that settles it
``admission``        deadlines, priorities and the overload limit of queued work
``batcher``          the bounded queue and the dynamic batcher, on the event loop
``pool``             the replica pool: picking a replica for a batch, answering a finished one
``replica``          one model copy on one device: placement, readiness, its worker thread
``execution``        one batch: gather, one H2D, forward, one D2H, split (OOM: split and retry)
``staging``          the reused (pinned on CUDA) staging buffers of a replica
``failures``         failure classes of a batch and a replica's health
``startup``          devices, torch threads and the start-up record
``loader``           building the model on the host (embedded, factory, weights, torch.export)
``torchscript``      TorchScript archives (Triton's PyTorch ``model.pt``): told apart, loaded
``reshape``          Triton's ``reshape``: the model's shape of a row where clients use the dims
``metrics``          Prometheus series of one engine, in its own registry
``triton_metrics``   Triton's ``nv_inference_*`` series, from each version's statistics
``triton_devices``   Triton's ``nv_gpu_*`` and ``nv_cpu_*`` gauges, read at scrape time
``log_settings``     Triton's logging extension: the log settings read and changed while serving
``trace_settings``   Triton's trace extension: the tracing of requests, changed while serving
``tracing``          Chrome/Perfetto traces and OpenTelemetry spans of batches
``triton_trace``     Triton's JSON trace file: every model's requests, every ``log_frequency``
``onray``            the Ray Serve deployment: this server in each Ray replica, on Ray's devices
``ray_cli``          ``--engine ray``: deploying on a Ray cluster from the command line
``kserve``           the arguments, environment and model directory KServe passes
===================  ===============================================================================

Nothing is imported here, so ``import torchplace.serve`` stays cheap.
"""

__all__: list[str] = []
