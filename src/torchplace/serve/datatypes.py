"""Open Inference Protocol datatype names and the numpy/torch dtypes they map to."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from torchplace.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = [
    "FLOAT_DATATYPES",
    "NUMPY_DTYPES",
    "SERVING_DTYPES",
    "numpy_dtype",
    "serving_dtype",
    "torch_dtype",
]

#: OIP datatype -> numpy dtype. BF16 has no numpy dtype and BYTES is not a torch type.
NUMPY_DTYPES: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}


def numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    """The numpy dtype of an OIP datatype name; ConfigError names the ones that exist."""
    try:
        return NUMPY_DTYPES[datatype]
    except KeyError:
        known = ", ".join(NUMPY_DTYPES)
        raise ConfigError(
            f"datatype {datatype!r} cannot be served by a torch model; use one of: {known}"
        ) from None


def torch_dtype(datatype: str) -> torch.dtype:
    """The torch dtype of an OIP datatype name."""
    import torch

    return torch.from_numpy(np.empty(0, dtype=numpy_dtype(datatype))).dtype


#: ``--dtype`` choices: the torch floating dtypes a replica's weights may be cast to.
SERVING_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
_DTYPE_NAMES: dict[str, str] = {
    **{name: name for name in SERVING_DTYPES},
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
}
#: OIP floating datatypes and their torch dtype names (the inputs a serving dtype casts).
FLOAT_DATATYPES: dict[str, str] = {"FP16": "float16", "FP32": "float32", "FP64": "float64"}


def serving_dtype(value: object, *, where: str = "dtype") -> str:
    """The canonical ``--dtype`` name (``float32``/``float16``/``bfloat16``) for ``value``.

    Accepts the aliases ``fp32``/``fp16``/``bf16``, in any case; anything else is a
    ConfigError naming the value and the choices.
    """
    name = _DTYPE_NAMES.get(value.strip().lower()) if isinstance(value, str) else None
    if name is None:
        raise ConfigError(
            f"{where}={value!r} is not a serving dtype; choose one of "
            f"{', '.join(SERVING_DTYPES)} (or fp32, fp16, bf16), or leave it unset to keep "
            "the model's own dtypes"
        )
    return name
