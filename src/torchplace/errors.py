"""The one exception tree of torchplace.

Every error torchplace raises on purpose derives from :class:`TorchplaceError`, so callers can
catch the whole family with one ``except``. Messages name the offending value and say how to fix
it.

::

    TorchplaceError
    ├── ConfigError                  bad argument, flag or configuration value (also a ValueError)
    ├── DeviceError                  a device spec that cannot be honoured
    │   ├── DeviceUnavailableError   no such backend here (CPU-only build, all GPUs hidden, ...)
    │   └── DeviceIndexError         an index past the visible devices
    ├── PlacementError               tensors or modules not where they should be
    │   └── MixedDeviceError         operands that should share a device do not
    ├── CheckpointError              a checkpoint that cannot be loaded as asked
    │   ├── UnsafeCheckpointError    a pickle that needs arbitrary code to load
    │   └── StateDictMismatchError   keys or shapes that do not fit the module
    ├── TimingError                  a measurement that cannot be made honestly
    ├── GuardViolation               a crossing that a guard in "raise" mode forbids
    └── ServeError                   a request or replica failure, with its HTTP status
        ├── InputError                400: the request does not match the model's inputs
        │   └── UnsupportedMediaTypeError 415: a content type or encoding the server does not take
        ├── ModelNotFoundError        404: no such model or version is loaded
        ├── ModelLoadError            400: a model (version) could not be loaded; the old one serves
        │   └── InsufficientMemoryError 409: the load would not fit in the device's free memory
        ├── ModelControlError         403: load/unload refused by the model control mode
        ├── PayloadTooLargeError      413: the body is over the limit
        ├── SharedMemoryError         400: a shared-memory region that cannot be registered or used
        │   ├── SharedMemoryDisabledError 403: client shared memory is off (--allow-client-shm)
        │   └── SharedMemoryNotFoundError 404: no region of that name is registered
        ├── OverloadedError           503: the queue is full
        ├── DeadlineExceededError     504: the deadline passed while queued; never run
        ├── NotReadyError             503: no ready replica
        ├── DeviceOutOfMemoryError    507: one row still does not fit after splitting
        ├── TransferError             500: a host/device copy failed
        └── KernelError               500: the forward pass failed
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DeadlineExceededError",
    "DeviceError",
    "DeviceIndexError",
    "DeviceOutOfMemoryError",
    "DeviceUnavailableError",
    "GuardViolation",
    "InputError",
    "InsufficientMemoryError",
    "KernelError",
    "MixedDeviceError",
    "ModelControlError",
    "ModelLoadError",
    "ModelNotFoundError",
    "NotReadyError",
    "OverloadedError",
    "PayloadTooLargeError",
    "PlacementError",
    "ServeError",
    "SharedMemoryDisabledError",
    "SharedMemoryError",
    "SharedMemoryNotFoundError",
    "StateDictMismatchError",
    "TimingError",
    "TorchplaceError",
    "TransferError",
    "UnsafeCheckpointError",
    "UnsupportedMediaTypeError",
    "UnsupportedSettingError",
]


class TorchplaceError(Exception):
    """Base class of every error torchplace raises on purpose."""


class ConfigError(TorchplaceError, ValueError):
    """A bad argument, command-line flag or configuration value."""


class DeviceError(TorchplaceError):
    """A device spec that cannot be honoured on this machine."""


class DeviceUnavailableError(DeviceError):
    """The requested backend is not usable here (CPU-only build, every GPU hidden, ...)."""


class DeviceIndexError(DeviceError, IndexError):
    """A device index past the devices this process can see."""


class PlacementError(TorchplaceError):
    """Tensors or modules are not on the device they should be on."""


class MixedDeviceError(PlacementError):
    """Operands that must share one device live on several."""


class CheckpointError(TorchplaceError):
    """A checkpoint that cannot be loaded as asked."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle that needs arbitrary code execution to load."""


class StateDictMismatchError(CheckpointError):
    """Checkpoint keys or shapes that do not fit the module."""


class TimingError(TorchplaceError):
    """A measurement that cannot be made honestly on the given device."""


class GuardViolation(TorchplaceError):
    """A device crossing or host sync that a guard in "raise" mode forbids."""


class ServeError(TorchplaceError):
    """A failure while serving a request; ``status`` is the HTTP status it maps to."""

    status: int = 500


class InputError(ServeError):
    """The request does not match the model's declared inputs."""

    status = 400


class ModelNotFoundError(ServeError):
    """No model (or version of it) of that name is loaded."""

    status = 404


class ModelLoadError(ServeError):
    """A model could not be loaded (config, weights, dry run); what served before still does."""

    status = 400


class InsufficientMemoryError(ModelLoadError):
    """A load that would not fit in the target device's free memory (or the budget)."""

    status = 409


class ModelControlError(ServeError):
    """Loading or unloading is not allowed in the server's model control mode."""

    status = 403


class PayloadTooLargeError(ServeError):
    """The request body is over the configured limit."""

    status = 413


class SharedMemoryError(ServeError):
    """A shared-memory region that cannot be registered, or a request's use of one."""

    status = 400


class SharedMemoryDisabledError(SharedMemoryError):
    """Client shared memory is off (the server runs without ``--allow-client-shm``)."""

    status = 403


class SharedMemoryNotFoundError(SharedMemoryError):
    """No shared-memory region of that name is registered."""

    status = 404


class UnsupportedMediaTypeError(InputError):
    """A content type or content encoding the server does not take."""

    status = 415


class UnsupportedSettingError(ServeError):
    """A server setting that cannot be changed over the network (Triton's log file, trace
    file); 501, gRPC ``UNIMPLEMENTED``."""

    status = 501


class OverloadedError(ServeError):
    """The queue is full; retry later."""

    status = 503


class DeadlineExceededError(ServeError):
    """The request's deadline passed while it was queued; it was never run (504)."""

    status = 504


class NotReadyError(ServeError):
    """No replica is ready to take the request."""

    status = 503


class DeviceOutOfMemoryError(ServeError):
    """A single row still does not fit in device memory after splitting the batch."""

    status = 507


class TransferError(ServeError):
    """A host-to-device or device-to-host copy failed."""

    status = 500


class KernelError(ServeError):
    """The model's forward pass failed on the device."""

    status = 500
