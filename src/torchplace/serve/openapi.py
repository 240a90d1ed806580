"""The OpenAPI 3.0 document ``torchplace serve`` publishes at ``/v2/openapi.json``.

Nothing here is restated by hand: the paths and operations come from the route declarations
(:data:`torchplace.serve.routes.ROUTES`), each operation's error responses from the statuses its
route declares (meanings in :data:`~torchplace.serve.routes.ERRORS`), and the schemas from the
Open Inference Protocol messages (:mod:`torchplace.serve.messages`), with the served models'
names, versions and tensors filled in (the first model's as the examples; the input and output
names of every model allowed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from torchplace import __version__
from torchplace.models import TensorSpec
from torchplace.serve.messages import example_request, message_schemas, ref
from torchplace.serve.routes import ERRORS, ROUTES, Route

__all__ = ["DocumentedModel", "openapi_document"]


class DocumentedModel(Protocol):
    """What the document needs of a served model version (a registry handle has it)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def inputs(self) -> Sequence[TensorSpec]: ...
    @property
    def outputs(self) -> Sequence[TensorSpec]: ...
    @property
    def max_request_rows(self) -> int: ...


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _path_parameters(path: str, name: str, version: str) -> list[dict[str, Any]]:
    found = []
    for param, example in (
        ("MODEL_NAME", name),
        ("MODEL_VERSION", version),
        ("REGION_NAME", "input_data"),
    ):
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


def openapi_document(models: Sequence[DocumentedModel], *, auth: bool = False) -> dict[str, Any]:
    """The OpenAPI document for a server that serves ``models`` (at least one; the first
    gives the examples); a request may carry as many rows as its model's ``max_request_rows``."""
    if not models:
        raise ValueError("an OpenAPI document needs at least one served model")
    first = models[0]
    rows = max(m.max_request_rows for m in models)
    paths: dict[str, Any] = {}
    for route in ROUTES:
        for path, operation_id in route.paths():
            item: dict[str, Any] = paths.setdefault(path, {})  # GET and POST of one path
            parameters = _path_parameters(path, first.name, first.version)
            if parameters:
                item["parameters"] = parameters
            item[route.method.lower()] = _operation(
                route, operation_id, auth=auth, inputs=first.inputs, rows=rows
            )
    served = ", ".join(f"model {m.name!r} version {m.version!r}" for m in models)
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "torchplace serve: Open Inference Protocol (KServe v2 REST)",
            "version": __version__,
            "description": (
                "Derived from the Open Inference Protocol's rest_predict_v2.yaml; serves "
                f"{served}. Binary tensor data extension supported."
            ),
            "license": {"name": "Apache 2.0"},
        },
        "paths": paths,
        "components": {
            "schemas": message_schemas(
                _unique(s for m in models for s in m.inputs),
                _unique(s for m in models for s in m.outputs),
            )
        },
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc


def _unique(specs: Iterable[TensorSpec]) -> list[TensorSpec]:
    """One spec per tensor name, in the order first seen."""
    seen: dict[str, TensorSpec] = {}
    for spec in specs:
        seen.setdefault(spec.name, spec)
    return list(seen.values())
