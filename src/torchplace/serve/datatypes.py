"""Open Inference Protocol datatype names and the numpy/torch dtypes they map to.

Every servable datatype has a host dtype (numpy: staging buffers, requests, results) and a
torch dtype (what the model sees). They are the same but for BF16: numpy has no bfloat16, so a
BF16 tensor is float32 on the host, crosses host <-> device as float32 and is cast to and from
torch.bfloat16 on the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from torchplace.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = [
    "HOST_DTYPES",
    "SERVING_DTYPES",
    "host_numpy_dtype",
    "host_torch_dtype",
    "oip_datatype",
    "serving_dtype",
    "torch_dtype",
]

#: OIP datatype -> the numpy dtype its tensors have on the host inside the server: the servable
#: datatypes (BYTES is not a torch type). A BF16 tensor is held as float32 (numpy has no
#: bfloat16): the codec widens the wire's bfloat16 bits exactly and rounds back to nearest even
#: on the way out.
HOST_DTYPES: dict[str, np.dtype[np.generic]] = {
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
    "BF16": np.dtype(np.float32),
}


def _unservable(datatype: str) -> ConfigError:
    known = ", ".join(HOST_DTYPES)
    return ConfigError(
        f"datatype {datatype!r} cannot be served by a torch model; use one of: {known}"
    )


def host_numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    """The numpy dtype a tensor of ``datatype`` has on the host (staging, dry runs, results).

    That is its own numpy dtype, or float32 for BF16; ConfigError names the servable ones.
    """
    try:
        return HOST_DTYPES[datatype]
    except KeyError:
        raise _unservable(datatype) from None


def host_torch_dtype(datatype: str) -> torch.dtype:
    """The torch dtype of the host representation (float32 for BF16): what crosses the bus."""
    import torch

    return torch.from_numpy(np.empty(0, dtype=host_numpy_dtype(datatype))).dtype


def torch_dtype(datatype: str) -> torch.dtype:
    """The torch dtype an OIP datatype names (torch.bfloat16 for BF16): what a model sees."""
    import torch

    if datatype == "BF16":
        return torch.bfloat16
    return host_torch_dtype(datatype)


def oip_datatype(dtype: torch.dtype) -> str | None:
    """The OIP datatype of a torch dtype (``BF16`` for torch.bfloat16); None: not servable."""
    for datatype in HOST_DTYPES:
        if torch_dtype(datatype) == dtype:
            return datatype
    return None


#: ``--dtype`` choices: the torch floating dtypes a replica's weights may be cast to.
SERVING_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
_DTYPE_NAMES: dict[str, str] = {
    **{name: name for name in SERVING_DTYPES},
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
}


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
