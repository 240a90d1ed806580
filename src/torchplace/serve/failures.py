"""Failure classes of a batch and the health of a replica.

A batch can fail in three ways, told apart by where the exception was raised and its type:

* ``oom`` -- :class:`torch.OutOfMemoryError` (``torch.cuda.OutOfMemoryError`` is the same class)
  anywhere in the batch: the replica releases cached memory, splits the batch in halves and
  retries; only a single row that still fails gets :class:`DeviceOutOfMemoryError` (507). OOM
  does not count against the replica's health.
* ``transfer`` -- any other exception while copying host -> device or device -> host:
  :class:`TransferError` (500).
* ``kernel`` -- any other exception in the forward pass: :class:`KernelError` (500). On CUDA the
  kernels run asynchronously and their faults (device-side asserts, illegal addresses) surface
  at the batch's one synchronisation, after the D2H was queued: a failure there counts as
  ``kernel`` too.

Transfer and kernel failures count as *consecutive failures*; after ``threshold`` in a row the
replica leaves the pool until a background dry run passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchplace.errors import (
    ConfigError,
    DeviceOutOfMemoryError,
    KernelError,
    ServeError,
    TransferError,
)

__all__ = ["FAILURE_KINDS", "BatchFailure", "HealthTracker", "describe", "is_oom"]

#: The failure kinds counted apart in metrics (``torchplace_errors_total{class=...}``).
FAILURE_KINDS = ("oom", "transfer", "kernel")


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is a device out-of-memory error (CUDA, MPS, XPU all raise this type)."""
    import torch

    # torch.OutOfMemoryError appeared in torch 2.5; torch.cuda's name for it is older
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom)


_SCRIPT_TRACEBACK = "The following operation failed in the TorchScript interpreter."


def describe(exc: BaseException, limit: int = 300) -> str:
    """One line that says what ``exc`` was: its type and first line, or, for an error raised
    inside a TorchScript forward (whose first line only says that one failed, then quotes the
    code), the error at the end of its traceback (``RuntimeError: The size of tensor a (3)
    must match ...``)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0] == _SCRIPT_TRACEBACK:
        return f"{type(exc).__name__}: TorchScript forward failed: {lines[-1]}"[:limit]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:limit]


@dataclass(frozen=True)
class BatchFailure:
    """A classified failure; :meth:`error` builds a fresh exception for each request."""

    kind: str  # one of FAILURE_KINDS
    device: str
    detail: str

    def error(self) -> ServeError:
        """A new exception instance (never shared between requests)."""
        if self.kind == "oom":
            return DeviceOutOfMemoryError(
                f"out of memory on {self.device} even for a single row: {self.detail}; "
                "lower --max-batch-size or use a device with more memory"
            )
        if self.kind == "transfer":
            return TransferError(f"host/device copy failed on {self.device}: {self.detail}")
        return KernelError(f"forward pass failed on {self.device}: {self.detail}")


class HealthTracker:
    """Counts consecutive transfer/kernel failures of one replica; thread-confined."""

    def __init__(self, threshold: int) -> None:
        if threshold < 1:
            raise ConfigError(f"failure_threshold must be >= 1, got {threshold}")
        self.threshold = threshold
        self.consecutive = 0
        self.healthy = True

    def success(self) -> None:
        """A batch (or dry run) passed."""
        self.consecutive = 0
        self.healthy = True

    def failure(self) -> bool:
        """A transfer/kernel failure; returns True when this one takes the replica out."""
        self.consecutive += 1
        if self.healthy and self.consecutive >= self.threshold:
            self.healthy = False
            return True
        return False
