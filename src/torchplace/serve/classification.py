"""Triton's classification extension: an output answered as its top classes, not its values.

A requested output with the ``classification`` parameter (``tritonclient``'s
``InferRequestedOutput(name, class_count=k)``) comes back as a ``BYTES`` tensor of shape
``[rows, k]``: for each row, its ``k`` largest values, best first, each the string
``"value:index"``, or ``"value:index:label"`` when the model has labels for that output. Values
are written as Triton writes them (C's ``%f`` for floats, integers as they are); ties keep the
lower index first.

Over REST the strings are JSON ``data`` or, as binary data, Triton's ``BYTES`` serialization
(each element a 4-byte little-endian length, then its bytes); over gRPC that serialization in
``raw_output_contents``, which ``tritonclient``'s ``as_numpy`` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from torchplace.errors import InputError

__all__ = ["CLASSIFIABLE", "MAX_CLASSIFIED", "classify", "serialize_bytes"]

#: the most values a row may have to be ranked (Triton's limit: a larger output is refused)
MAX_CLASSIFIED = 1_000_000

#: the datatypes whose values rank classes (everything but BOOL)
CLASSIFIABLE = frozenset(
    ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "BF16",
     "FP32", "FP64")
)  # fmt: skip


def _descending(rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Keys that sort ``rows`` from the largest value down: an integer type's own bits
    inverted (exact past 2**53, where float64 would tie 2**53 and 2**53 + 1; no overflow at the
    type's least value), a float's negation."""
    if rows.dtype == np.bool_:
        rows = rows.astype(np.uint8)
    if np.issubdtype(rows.dtype, np.integer):
        inverted: np.ndarray[Any, Any] = np.invert(rows)
        return inverted
    return -rows.astype(np.float64)


def classify(
    array: np.ndarray[Any, Any], datatype: str, count: int, labels: Sequence[str] = ()
) -> tuple[list[bytes], list[int]]:
    """Each row's ``count`` top classes as ``value:index[:label]``, and the ``[rows, k]``
    shape of the answer (``k``: ``count``, or fewer when a row has fewer values)."""
    rows = array.reshape(len(array), -1)
    if rows.shape[1] > MAX_CLASSIFIED:  # Triton's words first
        raise InputError(
            f"classification output tensor too large: {rows.shape[1]} values a row, at most "
            f"{MAX_CLASSIFIED:,} can be ranked; ask for the output's values instead"
        )
    k = min(count, rows.shape[1])
    order = np.argsort(_descending(rows), axis=1, kind="stable")[:, :k]
    floats = datatype.startswith(("FP", "BF"))
    found: list[bytes] = []
    for row, indices in zip(rows.tolist(), order.tolist(), strict=True):
        for index in indices:
            value = row[index]
            text = f"{value:f}:{index}" if floats else f"{value}:{index}"
            if index < len(labels):
                text += ":" + labels[index]
            found.append(text.encode())
    return found, [len(rows), k]


def serialize_bytes(items: Sequence[bytes]) -> bytes:
    """Triton's serialization of a ``BYTES`` tensor: each element's length (4 bytes,
    little-endian), then the element."""
    return b"".join(len(item).to_bytes(4, "little") + item for item in items)
