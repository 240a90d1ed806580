"""The OpenAPI 3.0 document ``torchplace serve`` publishes at ``/v2/openapi.json``.

It follows the official Open Inference Protocol document (kserve ``rest_predict_v2.yaml``):
the same paths, operations and schemas (``inference_request``, ``request_input``,
``tensor_data``, ``inference_response``, metadata and error objects), with the path templates
written as OpenAPI parameters, the error responses this server really gives (400, 401, 404,
405, 413, 415, 503, 507, 500) listed per operation, and the served model's name, version and
input declarations filled in as examples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchplace import __version__
from torchplace.models import TensorSpec

__all__ = ["openapi_document"]


def _ref(schema: str) -> dict[str, Any]:
    return {"$ref": "#/components/schemas/" + schema}


def _array_of(schema: str) -> dict[str, Any]:
    return {"type": "array", "items": _ref(schema)}


_ERROR = _ref("error_response")


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "Bad Request: the request does not match the model's inputs",
        401: "Unauthorized: missing or wrong bearer token",
        404: "Not Found: unknown model, version or route",
        405: "Method Not Allowed",
        413: "Payload Too Large: the body is over the limit",
        415: "Unsupported Media Type",
        500: "Internal Server Error: a transfer or kernel failure",
        503: "Service Unavailable: not ready, overloaded or shutting down (see Retry-After)",
        507: "Insufficient Storage: one row does not fit in device memory",
    }
    return {str(c): {"description": words[c], "content": _json(_ERROR)} for c in codes}


def _example_request(inputs: Sequence[TensorSpec]) -> dict[str, Any]:
    def value(datatype: str) -> object:
        return True if datatype == "BOOL" else 0.5 if datatype.startswith(("FP", "BF")) else 1

    tensors = []
    for spec in inputs:
        shape = [1 if d == -1 else d for d in spec.shape]
        count = 1
        for d in shape:
            count *= d
        tensors.append(
            {
                "name": spec.name,
                "datatype": spec.datatype,
                "shape": shape,
                "data": [value(spec.datatype)] * count,
            }
        )
    return {"id": "1", "inputs": tensors}


def openapi_document(
    *,
    name: str,
    version: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_batch_size: int,
    auth: bool = False,
) -> dict[str, Any]:
    """The OpenAPI document for a server that serves model ``name`` version ``version``."""
    model = {
        "name": "MODEL_NAME",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "example": name,
    }
    model_version = {
        "name": "MODEL_VERSION",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "example": version,
    }
    common = (401,) if auth else ()
    plain_ok = {"200": {"description": "OK", "content": _json({"type": "object"})}}

    def get(op_id: str, summary: str, ok: dict[str, Any], *codes: int) -> dict[str, Any]:
        return {
            "get": {
                "operationId": op_id,
                "summary": summary,
                "responses": {**ok, **_errors(*codes, *common)},
            }
        }

    def infer(op_id: str) -> dict[str, Any]:
        return {
            "post": {
                "operationId": op_id,
                "summary": "Inference",
                "description": (
                    f"Run the model on 1..{max_batch_size} rows. Tensors go as JSON 'data' or, "
                    "with the binary tensor data extension, after the JSON header whose length "
                    "is given in the Inference-Header-Content-Length header."
                ),
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": _ref("inference_request"),
                            "example": _example_request(inputs),
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": _json(_ref("inference_response")),
                    },
                    **_errors(400, 404, 413, 415, 500, 503, 507, *common),
                },
            }
        }

    metadata_ok = {
        "200": {
            "description": "OK",
            "content": _json(_ref("metadata_model_response")),
        }
    }
    paths: dict[str, Any] = {
        "/v2/health/live": {
            "get": {
                "operationId": "get-v2-health-live",
                "summary": "Server Live",
                "responses": {**plain_ok, **_errors(503)},
            }
        },
        "/v2/health/ready": {
            "get": {
                "operationId": "get-v2-health-ready",
                "summary": "Server Ready",
                "responses": {**plain_ok, **_errors(503)},
            }
        },
        "/v2": get(
            "get-v2",
            "Server Metadata",
            {
                "200": {
                    "description": "OK",
                    "content": _json(_ref("metadata_server_response")),
                }
            },
        ),
        "/v2/models/{MODEL_NAME}": {
            "parameters": [model],
            **get("get-v2-models-name", "Model Metadata", metadata_ok, 404),
        },
        "/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}": {
            "parameters": [model, model_version],
            **get("get-v2-models-name-versions-version", "Model Metadata", metadata_ok, 404),
        },
        "/v2/models/{MODEL_NAME}/ready": {
            "parameters": [model],
            **get("get-v2-models-name-ready", "Model Ready", plain_ok, 404, 503),
        },
        "/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/ready": {
            "parameters": [model, model_version],
            **get("get-v2-models-name-versions-version-ready", "Model Ready", plain_ok, 404, 503),
        },
        "/v2/models/{MODEL_NAME}/infer": {"parameters": [model], **infer("post-v2-infer")},
        "/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/infer": {
            "parameters": [model, model_version],
            **infer("post-v2-versions-infer"),
        },
        "/metrics": {
            "get": {
                "operationId": "get-metrics",
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_errors(404, *common),
                },
            }
        },
    }
    tensor_meta = {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"type": "string"},
            "datatype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
        },
    }
    schemas: dict[str, Any] = {
        "error_response": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        },
        "metadata_server_response": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "metadata_tensor": tensor_meta,
        "metadata_model_response": {
            "type": "object",
            "required": ["name", "platform"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": _array_of("metadata_tensor"),
                "outputs": _array_of("metadata_tensor"),
            },
        },
        "parameters": {"type": "object"},
        "tensor_data": {
            "type": "array",
            "items": {
                "anyOf": [
                    _ref("tensor_data"),
                    {"type": "number"},
                    {"type": "string"},
                    {"type": "boolean"},
                ]
            },
        },
        "request_input": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string", "enum": [s.name for s in inputs]},
                "shape": {"type": "array", "items": {"type": "integer"}},
                "datatype": {"type": "string"},
                "parameters": _ref("parameters"),
                "data": _ref("tensor_data"),
            },
        },
        "request_output": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "enum": [s.name for s in outputs]},
                "parameters": _ref("parameters"),
            },
        },
        "inference_request": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": _ref("parameters"),
                "inputs": _array_of("request_input"),
                "outputs": _array_of("request_output"),
            },
        },
        "response_output": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
                "datatype": {"type": "string"},
                "parameters": _ref("parameters"),
                "data": _ref("tensor_data"),
            },
        },
        "inference_response": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "parameters": _ref("parameters"),
                "outputs": _array_of("response_output"),
            },
        },
    }
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "torchplace serve: Open Inference Protocol (KServe v2 REST)",
            "version": __version__,
            "description": (
                "Derived from the Open Inference Protocol's rest_predict_v2.yaml; serves model "
                f"{name!r} version {version!r}. Binary tensor data extension supported."
            ),
            "license": {"name": "Apache 2.0"},
        },
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, item in paths.items():
            if path.startswith("/v2/health/"):
                continue
            for key, op in item.items():
                if key != "parameters":
                    op["security"] = [{"bearer": []}]
    return doc
