"""The OpenAPI 3.0 document ``torchplace serve`` publishes at ``/v2/openapi.json``.

Nothing here is restated by hand: the paths and operations come from the route declarations
(:data:`torchplace.serve.routes.ROUTES`), each operation's error responses from the statuses its
route declares (meanings in :data:`~torchplace.serve.routes.ERRORS`), and the schemas from the
Open Inference Protocol messages (:mod:`torchplace.serve.messages`), with the served model's
name, version and tensors filled in as examples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchplace import __version__
from torchplace.models import TensorSpec
from torchplace.serve.messages import example_request, message_schemas, ref
from torchplace.serve.routes import ERRORS, ROUTES, Route

__all__ = ["openapi_document"]


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _path_parameters(path: str, name: str, version: str) -> list[dict[str, Any]]:
    found = []
    for param, example in (("MODEL_NAME", name), ("MODEL_VERSION", version)):
        if "{" + param + "}" in path:
            found.append(
                {
                    "name": param,
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                    "example": example,
                }
            )
    return found


def _operation(
    route: Route, operation_id: str, *, auth: bool, inputs: Sequence[TensorSpec], rows: int
) -> dict[str, Any]:
    body = ref(route.ok) if route.ok is not None else {"type": "object"}
    if route.content_type != "application/json":
        ok_content: dict[str, Any] = {route.content_type: {"schema": {"type": "string"}}}
    else:
        ok_content = _json(body)
    codes = sorted({*route.errors, *((401,) if auth and not route.public else ())})
    op: dict[str, Any] = {
        "operationId": operation_id,
        "summary": route.summary,
        "responses": {
            "200": {"description": "OK", "content": ok_content},
            **{str(c): {"description": ERRORS[c], "content": _json(ref("error_response"))}
               for c in codes},
        },
    }  # fmt: skip
    if route.body is not None:
        op["description"] = (
            f"Run the model on 1..{rows} rows. Tensors go as JSON 'data' or, with the binary "
            "tensor data extension, after the JSON header whose length is given in the "
            "Inference-Header-Content-Length header."
        )
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": ref(route.body), "example": example_request(inputs)}
            },
        }
    if auth and not route.public:
        op["security"] = [{"bearer": []}]
    return op


def openapi_document(
    *,
    name: str,
    version: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_rows: int,
    auth: bool = False,
) -> dict[str, Any]:
    """The OpenAPI document for a server that serves model ``name`` version ``version``;
    ``max_rows`` is the most rows one request may carry."""
    paths: dict[str, Any] = {}
    for route in ROUTES:
        for path, operation_id in route.paths():
            item: dict[str, Any] = {}
            parameters = _path_parameters(path, name, version)
            if parameters:
                item["parameters"] = parameters
            item[route.method.lower()] = _operation(
                route, operation_id, auth=auth, inputs=inputs, rows=max_rows
            )
            paths[path] = item
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
        "components": {"schemas": message_schemas(inputs, outputs)},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
