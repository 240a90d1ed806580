"""The routes ``torchplace serve`` answers, and the error statuses they give, declared once.

:data:`ROUTES` is read twice: :class:`~torchplace.serve.app.App` builds its routing table from it
(each route's ``handler`` is the name of an App method) and
:func:`~torchplace.serve.openapi.openapi_document` derives the published OpenAPI document
from it. A route with ``versioned`` is also served under ``/versions/{MODEL_VERSION}``.
:data:`ERRORS` says what each error status means; the body of every error is
``{"error": "..."}`` (the ``error_response`` message of :mod:`torchplace.serve.messages`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ERRORS", "MODEL", "REPOSITORY", "ROUTES", "SHARED_MEMORY", "Route"]

#: the model path prefix, with the OpenAPI parameter for the model's name
MODEL = "/v2/models/{MODEL_NAME}"
#: the repository extension's prefix (its routes take any model name, loaded or not)
REPOSITORY = "/v2/repository"
#: the system shared-memory extension's prefix (its region routes take any region name)
SHARED_MEMORY = "/v2/systemsharedmemory"
_REGION = SHARED_MEMORY + "/region/{REGION_NAME}"
_VERSION = "/versions/{MODEL_VERSION}"

#: every error status the server gives, and what it means
ERRORS: dict[int, str] = {
    400: "Bad Request: the request is malformed, or does not match what the route takes",
    401: "Unauthorized: missing or wrong bearer token",
    403: "Forbidden: load/unload refused by the model control mode, or client shared memory off",
    404: "Not Found: unknown model, version, route or shared-memory region",
    405: "Method Not Allowed",
    409: "Conflict: the model would not fit in the device's free memory (or the budget)",
    413: "Payload Too Large: the body, or its rows, are over the limit",
    415: "Unsupported Media Type",
    500: "Internal Server Error: a transfer or kernel failure",
    501: "Not Implemented: a transfer coding other than chunked, or KServe V1's :explain",
    503: "Service Unavailable: not ready, overloaded or shutting down (see Retry-After)",
    504: "Gateway Timeout: the request's deadline passed before it reached the device",
    507: "Insufficient Storage: one row does not fit in device memory",
}


@dataclass(frozen=True)
class Route:
    """One route: where, how, which App method answers, and what it can answer."""

    path: str
    method: str
    handler: str
    operation: str
    summary: str
    #: the message (a schema of :mod:`torchplace.serve.messages`) of a 200; None: any object
    ok: str | None = None
    errors: tuple[int, ...] = ()
    #: answered without a bearer token (the health probes)
    public: bool = False
    versioned: bool = False
    content_type: str = "application/json"
    #: the request body's message, for POST routes
    body: str | None = None

    def paths(self) -> list[tuple[str, str]]:
        """``(OpenAPI path, operationId)`` of the route and, if versioned, its versioned twin."""
        found = [(self.path, self.operation)]
        if self.versioned:
            versioned = self.path.replace(MODEL, MODEL + _VERSION, 1)
            found.append((versioned, self.operation.replace("models-name", "models-name-version")))
        return found


ROUTES: tuple[Route, ...] = (
    Route("/v2/health/live", "GET", "_live", "get-v2-health-live", "Server Live",
          errors=(503,), public=True),
    Route("/v2/health/ready", "GET", "_ready", "get-v2-health-ready", "Server Ready",
          errors=(503,), public=True),
    Route("/v2", "GET", "_metadata", "get-v2", "Server Metadata", ok="metadata_server_response"),
    Route("/v2/models", "GET", "_models_list", "get-v2-models", "The models served (KServe's)"),
    Route(MODEL, "GET", "_model_metadata", "get-v2-models-name", "Model Metadata",
          ok="metadata_model_response", errors=(404,), versioned=True),
    Route(MODEL + "/ready", "GET", "_model_ready", "get-v2-models-name-ready", "Model Ready",
          errors=(404, 503), versioned=True),
    Route(MODEL + "/config", "GET", "_config_doc", "get-v2-models-name-config",
          "Model Configuration (Triton's)", errors=(404,), versioned=True),
    Route(MODEL + "/stats", "GET", "_stats_doc", "get-v2-models-name-stats",
          "Model Statistics (Triton's)", errors=(404,), versioned=True),
    Route("/v2/models/stats", "GET", "_stats_doc", "get-v2-models-stats",
          "Statistics of every model (Triton's)"),
    Route(MODEL + "/infer", "POST", "_infer", "post-v2-models-name-infer", "Inference",
          ok="inference_response", errors=(400, 404, 413, 415, 500, 503, 504, 507),
          versioned=True, body="inference_request"),
    Route(REPOSITORY + "/index", "POST", "_repository", "post-v2-repository-index",
          "Repository index (Triton's)"),
    Route(REPOSITORY + "/models/{MODEL_NAME}/load", "POST", "_repository",
          "post-v2-repository-models-name-load", "Load or reload a model (Triton's)",
          errors=(400, 403, 404, 409)),
    Route(REPOSITORY + "/models/{MODEL_NAME}/unload", "POST", "_repository",
          "post-v2-repository-models-name-unload", "Unload a model (Triton's)",
          errors=(403, 404)),
    Route(SHARED_MEMORY + "/status", "GET", "_shared_memory", "get-v2-systemsharedmemory-status",
          "System shared-memory regions (Triton's)"),
    Route(_REGION + "/status", "GET", "_shared_memory",
          "get-v2-systemsharedmemory-region-name-status",
          "A system shared-memory region (Triton's)", errors=(404,)),
    Route(_REGION + "/register", "POST", "_shared_memory",
          "post-v2-systemsharedmemory-region-name-register",
          "Register a system shared-memory region (Triton's)", errors=(400, 403)),
    Route(_REGION + "/unregister", "POST", "_shared_memory",
          "post-v2-systemsharedmemory-region-name-unregister",
          "Unregister a system shared-memory region (Triton's)", errors=(403,)),
    Route(SHARED_MEMORY + "/unregister", "POST", "_shared_memory",
          "post-v2-systemsharedmemory-unregister",
          "Unregister every system shared-memory region (Triton's)", errors=(403,)),
    Route("/v2/trace/setting", "GET", "_trace", "get-v2-trace-setting",
          "Trace settings (Triton's)"),
    Route("/v2/trace/setting", "POST", "_trace", "post-v2-trace-setting",
          "Change trace settings (Triton's)", errors=(400, 501)),
    Route(MODEL + "/trace/setting", "GET", "_model_trace", "get-v2-models-name-trace-setting",
          "A model's trace settings (Triton's)", errors=(404,)),
    Route(MODEL + "/trace/setting", "POST", "_model_trace", "post-v2-models-name-trace-setting",
          "Change a model's trace settings (Triton's)", errors=(400, 404, 501)),
    Route("/v2/logging", "GET", "_logging", "get-v2-logging", "Log settings (Triton's)"),
    Route("/v2/logging", "POST", "_logging", "post-v2-logging",
          "Change log settings (Triton's)", errors=(400, 501)),
    Route("/metrics", "GET", "_metrics", "get-metrics", "Prometheus metrics",
          errors=(404,), content_type="text/plain"),
    Route("/v2/openapi.json", "GET", "_openapi_doc", "get-v2-openapi", "This OpenAPI document"),
)  # fmt: skip
