"""Reusable host staging buffers: the rows of a batch are gathered here before the one H2D.

One :class:`StagingBuffers` belongs to one replica and is used by its worker thread only, one
batch at a time. Input buffers hold ``max_rows`` rows of every input whose row shape is fixed;
on a CUDA replica they are page-locked (pinned) so the H2D copy can be asynchronous. Output
buffers (CUDA only) are allocated after the dry run, when the output row shapes are known, and
receive the one D2H copy per output.

Gathering is a ``numpy.concatenate`` straight into the buffer (no intermediate array) and the
torch view of the buffer is shared memory (``torch.from_numpy`` / ``Tensor.numpy``), so the
host side of a batch costs exactly one memcpy per input.

Buffers hold the host representation of each datatype (:func:`host_numpy_dtype`): a BF16
tensor is staged as float32 and cast to bfloat16 on the device, after its one copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from torchplace.errors import InputError
from torchplace.models import TensorSpec
from torchplace.serve.datatypes import host_numpy_dtype

if TYPE_CHECKING:
    import torch

__all__ = ["StagingBuffers"]


class _HostBuffer:
    __slots__ = ("array", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.array: np.ndarray = tensor.numpy()


class StagingBuffers:
    """Host buffers for one replica's inputs (and, once known, outputs)."""

    def __init__(self, inputs: Sequence[TensorSpec], max_rows: int, *, pin: bool) -> None:
        self.inputs = tuple(inputs)
        self.max_rows = max_rows
        self.pin = pin
        self._in: dict[str, _HostBuffer | None] = {
            spec.name: self._allocate(spec.datatype, spec.shape[1:]) for spec in self.inputs
        }
        self._out: dict[str, _HostBuffer] = {}
        #: inputs gathered into a page-locked buffer: their H2D may be asynchronous
        self.pinned_inputs = frozenset(
            name for name, buffer in self._in.items() if buffer is not None and self.pin
        )

    def _allocate(self, datatype: str, row_shape: tuple[int, ...]) -> _HostBuffer | None:
        import torch

        if any(dim < 0 for dim in row_shape):
            return None  # a dynamic dimension: gathered per batch instead
        array = np.zeros((self.max_rows, *row_shape), dtype=host_numpy_dtype(datatype))
        tensor = torch.from_numpy(array)
        if self.pin:
            tensor = tensor.pin_memory()
        return _HostBuffer(tensor)

    @property
    def nbytes(self) -> int:
        """Bytes held by every staging buffer."""
        buffers = [b for b in self._in.values() if b is not None] + list(self._out.values())
        return sum(b.array.nbytes for b in buffers)

    def is_pinned(self) -> bool:
        """Whether every allocated buffer is page-locked."""
        buffers = [b for b in self._in.values() if b is not None] + list(self._out.values())
        return bool(buffers) and all(b.tensor.is_pinned() for b in buffers)

    def gather(
        self, requests: Sequence[Mapping[str, np.ndarray]], rows: int
    ) -> dict[str, torch.Tensor]:
        """Copy the rows of every request into the buffers; host tensors of ``rows`` rows."""
        import torch

        gathered: dict[str, torch.Tensor] = {}
        for spec in self.inputs:
            name = spec.name
            buffer = self._in[name]
            try:
                arrays = [request[name] for request in requests]
                if buffer is None:
                    joined = np.concatenate(arrays, axis=0) if len(arrays) > 1 else arrays[0]
                    gathered[name] = torch.from_numpy(np.array(joined, copy=True))
                    continue
                target = buffer.array[:rows]
                if len(arrays) == 1:
                    target[...] = arrays[0]
                else:
                    np.concatenate(arrays, axis=0, out=target)
            except KeyError:
                raise InputError(f"input {name!r} is missing from the request") from None
            except (ValueError, TypeError) as exc:
                raise InputError(
                    f"input {name!r} does not fit {spec.datatype} rows of shape "
                    f"{list(spec.shape[1:])}: {exc}"
                ) from None
            gathered[name] = buffer.tensor[:rows]
        return gathered

    def prepare_outputs(self, outputs: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> None:
        """Allocate output buffers for the given (dtype, row shape) of each output."""
        import torch

        for name, (dtype, row_shape) in outputs.items():
            tensor = torch.empty(
                (self.max_rows, *row_shape), dtype=dtype, device="cpu", pin_memory=self.pin
            )
            self._out[name] = _HostBuffer(tensor)

    def output(self, name: str) -> torch.Tensor | None:
        """The host output buffer of ``name`` (full ``max_rows``), if one was prepared."""
        buffer = self._out.get(name)
        return None if buffer is None else buffer.tensor

    def output_array(self, name: str) -> np.ndarray:
        """The numpy view of a prepared output buffer."""
        return self._out[name].array
