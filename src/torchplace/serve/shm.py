"""Triton's system shared-memory extension: tensors that cross in host memory, not the socket.

A client on the same machine creates a POSIX shared-memory object (``/dev/shm/KEY``; what
``tritonclient.utils.shared_memory`` does), registers a range of it under a region name, and
then names the region instead of sending data: an input's ``shared_memory_region``,
``shared_memory_byte_size`` and optional ``shared_memory_offset`` parameters say where its
bytes are; the same parameters on a requested output say where its bytes go, and the answer
then carries the output's name, datatype and shape only.

:class:`SharedMemoryRegions` is the registry, shared by the REST and gRPC sides. Registering
opens the object once and keeps its descriptor; an input's bytes are read from it when the
request is decoded, an output's written to it when the answer is encoded, with ``pread`` and
``pwrite`` rather than through a mapping: a client that truncates the object under the server
gets an error for that request (a mapping would crash the process with SIGBUS). A request in
flight holds the regions it named (:meth:`SharedMemoryRegions.hold`): unregistering one of them
leaves it listed and usable until the last such request is answered, as in Triton, and its
descriptor is closed then. At most :data:`MAX_REGIONS` regions are registered at once.

Client shared memory is off unless the server runs with ``--allow-client-shm`` (as Triton's
``--allow-client-shm``): a client that may register regions may read and write any
shared-memory object the server's user can open. Off, the status lists nothing and register/unregister are refused
with :class:`~torchplace.errors.SharedMemoryDisabledError`. CUDA shared memory (cudaIpc
handles) is not supported: its status lists nothing, its unregister has nothing to do, and its
register is refused with the alternative.
"""

from __future__ import annotations

import contextlib
import math
import os
import reprlib
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from torchplace.errors import (
    SharedMemoryDisabledError,
    SharedMemoryError,
    SharedMemoryNotFoundError,
)

__all__ = [
    "CUDA_REFUSED",
    "MAX_REGIONS",
    "RESERVED_PREFIX",
    "Region",
    "SharedMemoryExistsError",
    "SharedMemoryFullError",
    "SharedMemoryOpenError",
    "SharedMemoryRegions",
    "Target",
    "check_region_named",
]

_T = TypeVar("_T")
#: where POSIX shared-memory objects live on Linux (what ``shm_open`` opens)
SHM_ROOT = Path("/dev/shm")
#: regions registered at once, at most (each holds a file descriptor)
MAX_REGIONS = 1024
#: the answer to a CUDA shared-memory registration
CUDA_REFUSED = (
    "CUDA shared memory is not supported by this server; register system shared memory "
    "(/v2/systemsharedmemory) or send the tensor data in the request"
)
#: keys Triton keeps for its Python backend's own regions, refused as Triton refuses them
RESERVED_PREFIX = "triton_python_backend_shm_region_"


class SharedMemoryExistsError(SharedMemoryError):
    """A region name already registered: Triton's ``ALREADY_EXISTS`` ("already in manager"),
    which its REST front answers 400 and its gRPC front ``ALREADY_EXISTS``."""


class SharedMemoryFullError(SharedMemoryError):
    """:data:`MAX_REGIONS` regions are registered already: a 400 over REST, gRPC's
    ``RESOURCE_EXHAUSTED`` (a limit reached, not a malformed request)."""


class SharedMemoryOpenError(SharedMemoryError):
    """The object a registration names cannot be opened: Triton answers it as an internal
    error (gRPC ``INTERNAL``, HTTP 500), and its clients' tests match on that."""

    status = 500


@dataclass(eq=False)
class Region:
    """A registered range of a shared-memory object: ``byte_size`` bytes from ``offset``."""

    name: str
    key: str
    offset: int
    byte_size: int
    #: the object's descriptor, open read-write while the region is registered
    fd: int
    #: requests in flight that named the region
    users: int = 0
    #: unregistered while in use: it goes when its last user is answered
    leaving: bool = False

    def status(self) -> dict[str, Any]:
        """The region's entry in a status response."""
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}  # fmt: skip

    def read(self, start: int, size: int) -> bytes:
        """``size`` bytes from ``start`` into the region (the object as it is now)."""
        data = os.pread(self.fd, size, self.offset + start)
        if len(data) != size:
            raise SharedMemoryError(
                f"shared memory region '{self.name}': the object {self.key!r} now ends before "
                f"byte {self.offset + start + size} (it was truncated after it was "
                "registered); register it again"
            )
        return data


@dataclass(frozen=True)
class Target:
    """Where an output goes, or an input comes from: ``size`` bytes from ``start`` into a
    region."""

    region: Region
    start: int
    size: int

    def read(self) -> bytes:
        """The target's bytes (the object as it is now)."""
        return self.region.read(self.start, self.size)

    def write(self, data: Any) -> None:
        """Write ``data`` (bytes, or a contiguous array) at the target's start."""
        os.pwrite(self.region.fd, data, self.region.offset + self.start)


class SharedMemoryRegions:
    """The registered system shared-memory regions of one server (see the module docstring)."""

    def __init__(self, *, allowed: bool, root: Path = SHM_ROOT) -> None:
        self.allowed = allowed
        self._root = root
        self._regions: dict[str, Region] = {}
        self._used: list[Region] | None = None

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every region's status, or the one named (not registered: 404)."""
        if name is None:
            return [region.status() for region in self._regions.values()]
        return [self._get(name).status()]

    def register(self, name: str, key: object, offset: object, byte_size: object) -> None:
        """Register ``byte_size`` bytes from ``offset`` of the object ``key`` as ``name``."""
        self._check_allowed()
        if not name:
            raise SharedMemoryError("a region name is needed to register system shared memory")
        if name in self._regions:
            raise SharedMemoryExistsError(
                f"shared memory region '{name}' already in manager; unregister it first or "
                "choose another name"
            )
        if len(self._regions) >= MAX_REGIONS:
            raise SharedMemoryFullError(
                f"{MAX_REGIONS} shared memory regions are registered, the most this server "
                "holds at once; unregister some, or register larger regions and use offsets"
            )
        path = self._path(name, key)
        offset, byte_size = _natural("offset", offset), _natural("byte_size", byte_size)
        fd = self._open(name, str(key), path, offset, byte_size)
        self._regions[name] = Region(name, str(key), offset, byte_size, fd)

    def unregister(self, name: str | None = None) -> None:
        """Forget the region ``name`` (every region when None); an unknown name is no error.
        A region that requests in flight named stays, listed and usable, until the last of
        them is answered (as in Triton)."""
        self._check_allowed()
        names = list(self._regions) if name is None else [name]
        for region in [self._regions[n] for n in names if n in self._regions]:
            region.leaving = True
            if not region.users:
                self._drop(region)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[Region]]:
        """The regions the views taken inside the block come from (a request's decode)."""
        used: list[Region] = []
        self._used = used
        try:
            yield used
        finally:
            self._used = None

    @property
    def empty(self) -> bool:
        """No region is registered now."""
        return not self._regions

    def holding(
        self, decode: Callable[..., _T], *args: Any, **kwargs: Any
    ) -> tuple[_T, tuple[Region, ...]]:
        """``decode(*args, **kwargs)`` (a request's decode), and the regions it named, held
        until :meth:`release`; nothing recorded while no region is registered."""
        if not self._regions:
            return decode(*args, **kwargs), ()
        with self.recording() as used:
            decoded = decode(*args, **kwargs)
        return decoded, self.hold(used)

    def hold(self, used: list[Region]) -> tuple[Region, ...]:
        """Count a request as a user of the regions it named, until :meth:`release`."""
        held = tuple(dict.fromkeys(used))
        for region in held:
            region.users += 1
        return held

    def release(self, held: tuple[Region, ...]) -> None:
        """The request that held these regions is answered; unregistered ones now go."""
        for region in held:
            region.users -= 1
            if region.leaving and not region.users and self._regions.get(region.name) is region:
                self._drop(region)

    def _drop(self, region: Region) -> None:
        del self._regions[region.name]
        os.close(region.fd)

    def target(self, name: object, offset: object, byte_size: object, what: str) -> Target:
        """Where an output goes, or an input comes from: ``byte_size`` bytes from ``offset``
        into the region ``name``, checked to lie inside it; nothing is read."""
        return Target(*self._locate(name, offset, byte_size, what))

    def _locate(
        self, name: object, offset: object, byte_size: object, what: str
    ) -> tuple[Region, int, int]:
        """The region ``name`` and the range ``offset``, ``byte_size`` checked inside it."""
        if not isinstance(name, str):
            raise SharedMemoryError(f"{what}: 'shared_memory_region' must be a region name")
        if byte_size is None:
            raise SharedMemoryError(
                f"{what}: 'shared_memory_byte_size' is needed with 'shared_memory_region'"
            )
        self._check_allowed()
        region = self._get(name)
        if self._used is not None:
            self._used.append(region)
        offset = _natural(f"{what}: shared_memory_offset", 0 if offset is None else offset)
        size = _natural(f"{what}: shared_memory_byte_size", byte_size)
        if offset >= region.byte_size:
            raise SharedMemoryError(
                f"Invalid offset for shared memory region: '{name}' ({what}: offset {offset} "
                f"is past its {region.byte_size} bytes)"
            )
        if offset + size > _SIZE_MAX:  # the protocol's sizes are 64-bit: Triton's words
            raise SharedMemoryError(
                f"Integer overflow detected: byte_size ({size}) + offset ({offset}) exceeds "
                f"maximum value ({_SIZE_MAX}) for region '{name}' ({what}; the region holds "
                f"{region.byte_size} bytes)"
            )
        if offset + size > region.byte_size:
            raise SharedMemoryError(
                f"Invalid offset + byte size for shared memory region: '{name}' ({what}: "
                f"{offset} + {size} bytes is past its {region.byte_size} bytes)"
            )
        return region, offset, size

    def cuda_status(self, name: str | None = None) -> list[dict[str, Any]]:
        """CUDA regions: there are none (a named one is 404)."""
        if name is not None:
            raise SharedMemoryNotFoundError(
                f"Unable to find cuda shared memory region: '{name}'; {CUDA_REFUSED}"
            )
        return []

    def cuda_register(self, name: str = "") -> None:
        """Refused (Triton's words first): see :data:`CUDA_REFUSED`."""
        self._check_allowed()
        raise SharedMemoryError(
            f"failed to register shared memory region '{name}': invalid args; {CUDA_REFUSED}"
        )

    def cuda_unregister(self) -> None:
        """Nothing to unregister (refused like the system regions' when disabled)."""
        self._check_allowed()

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise SharedMemoryDisabledError(
                "Client shared memory is disabled; start the server with --allow-client-shm "
                "to register regions, or send the tensor data in the request"
            )

    def _get(self, name: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            known = ", ".join(repr(n) for n in self._regions) or "none"
            raise SharedMemoryNotFoundError(
                f"Unable to find system shared memory region: '{name}' (registered: {known}); "
                "register it first"
            )
        return region

    def _path(self, name: str, key: object) -> Path:
        """The object ``key`` names, as ``shm_open`` reads it: leading slashes dropped, then
        one path component."""
        bare = key.lstrip("/") if isinstance(key, str) else ""
        if not bare or "/" in bare or "\0" in bare or bare in (".", ".."):
            raise SharedMemoryError(
                f"cannot register shared memory region '{name}' - invalid shm key {key!r}; "
                "give the key the object was created with, such as '/input_data'"
            )
        if bare.startswith(RESERVED_PREFIX):
            raise SharedMemoryError(
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{RESERVED_PREFIX}'; create the object under "
                "another key"
            )
        return self._root / bare

    @staticmethod
    def _open(name: str, key: str, path: Path, offset: int, byte_size: int) -> int:
        """The object's descriptor, once the range is checked to lie inside it."""
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
        except OSError as exc:
            raise SharedMemoryOpenError(  # the key as sent, as Triton says it
                f"Unable to open shared memory region: '{key}' ({exc.strerror}); create "
                "it before registering it (tritonclient.utils.shared_memory does)"
            ) from None
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            os.close(fd)
            raise SharedMemoryError(
                f"failed to register shared memory region '{name}': {path.name!r} is not a "
                "shared memory object; give the key it was created with"
            )
        size = status.st_size
        if offset + byte_size > size or byte_size == 0:
            os.close(fd)
            raise SharedMemoryError(
                f"failed to register shared memory region '{name}': invalid args (offset "
                f"{offset} + byte_size {byte_size} must fit in the object's {size} bytes, "
                "byte_size at least 1)"
            )
        return fd


def check_region_named(tensor: str, params: Any) -> None:
    """An offset or size needs a region: refused without one, in Triton's words (a misspelt
    ``shared_memory_region`` key would otherwise have the data sent in the message instead, and
    the client read a region nothing wrote). ``params``: an input's or output's parameters."""
    if "shared_memory_region" in params:
        return
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key in params:
            raise SharedMemoryError(
                f"{key!r} can not be specified without 'shared_memory_region' parameter for "
                f"tensor {tensor!r}; name the registered region in 'shared_memory_region', or "
                f"drop {key!r}"
            )


#: the largest byte count or offset the protocol carries (an unsigned 64-bit integer)
_SIZE_MAX = 2**64 - 1


def _natural(what: str, value: object) -> int:
    """A byte count or offset: a non-negative integer."""
    if type(value) is not int or value < 0:
        shown = reprlib.repr(value)
        if isinstance(value, float) and value > _SIZE_MAX and not math.isinf(value):
            # JSON parsing reads an integer past 64 bits as a float: say so, not just the float
            shown += " (past 64 bits: a JSON integer this large is read as a float)"
        raise SharedMemoryError(
            f"{what} must be a non-negative integer (at most {_SIZE_MAX}), got {shown}"
        )
    return value
