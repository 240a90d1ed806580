"""The settings every differential fuzz test of the server shares: reproducible runs (the same
examples each time, nothing kept between runs), no per-example deadline on a shared machine."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from torchplace.serve.datatypes import HOST_DTYPES

#: 200 generated cases a test, the same ones every run
FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def exact_values(datatype: str) -> st.SearchStrategy[Any]:
    """Finite values ``datatype`` holds exactly, so that JSON, binary tensor data and gRPC's
    raw and typed fields must all carry them alike."""
    if datatype == "BOOL":
        return st.booleans()
    if datatype == "BF16":
        finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
        return finite.map(bf16_truncated).filter(np.isfinite)
    if datatype in ("FP16", "FP32", "FP64"):
        width = {"FP16": 16, "FP32": 32, "FP64": 64}[datatype]
        return st.floats(allow_nan=False, allow_infinity=False, width=width)  # type: ignore[arg-type]
    info = np.iinfo(HOST_DTYPES[datatype])
    return st.integers(int(info.min), int(info.max))


def bf16_truncated(value: float) -> float:
    """``value`` with its float32 bits past bfloat16's cut off: a value bfloat16 holds."""
    bits = np.array([value], np.float32).view(np.uint32) & 0xFFFF0000
    return float(bits.view(np.float32)[0])


def array_bits(inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, tuple[Any, ...]]:
    """Decoded arrays as comparable values: each its dtype, shape and bytes (so that -0.0 and
    0.0, or two NaNs of other bits, are told apart)."""
    return {
        name: (array.dtype.str, array.shape, np.ascontiguousarray(array).tobytes())
        for name, array in sorted(inputs.items())
    }
