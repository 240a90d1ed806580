"""The messages of the Open Inference Protocol, as JSON Schema (from kserve's
``rest_predict_v2.yaml``): the objects :mod:`torchplace.serve.protocol` reads and writes.

:func:`message_schemas` gives them with the served model's tensor names filled in, for the
OpenAPI document; :func:`example_request` is a valid inference request for the served inputs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from torchplace.models import TensorSpec

__all__ = ["example_request", "message_schemas", "ref"]


def ref(schema: str) -> dict[str, Any]:
    """A JSON reference to one of these messages."""
    return {"$ref": "#/components/schemas/" + schema}


def _array_of(schema: str) -> dict[str, Any]:
    return {"type": "array", "items": ref(schema)}


_TENSOR_META: dict[str, Any] = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
    },
}
_SCHEMAS: dict[str, Any] = {
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
    "metadata_tensor": _TENSOR_META,
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
                ref("tensor_data"),
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
            "name": {"type": "string"},  # enum: the served inputs
            "shape": {"type": "array", "items": {"type": "integer"}},
            "datatype": {"type": "string"},
            "parameters": ref("parameters"),
            "data": ref("tensor_data"),
        },
    },
    "request_output": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string"},  # enum: the served outputs
            "parameters": ref("parameters"),
        },
    },
    "inference_request": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": ref("parameters"),
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
            "parameters": ref("parameters"),
            "data": ref("tensor_data"),
        },
    },
    "inference_response": {
        "type": "object",
        "required": ["model_name", "outputs"],
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "parameters": ref("parameters"),
            "outputs": _array_of("response_output"),
        },
    },
}


def example_request(inputs: Sequence[TensorSpec]) -> dict[str, Any]:
    """One request of one row (zero-free values of each input's datatype)."""

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


def message_schemas(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> dict[str, Any]:
    """Every message, the input and output names restricted to the served model's."""
    schemas = copy.deepcopy(_SCHEMAS)
    schemas["request_input"]["properties"]["name"]["enum"] = [s.name for s in inputs]
    schemas["request_output"]["properties"]["name"]["enum"] = [s.name for s in outputs]
    return schemas
