"""The guard itself: :class:`Guard` turns what its two layers see into events of one report.

How it works, and why it is cheap (one module per part):

* :mod:`~torchplace.sanitizer.function_mode`: a torch-function mode, the front door every torch
  call goes through; pure device compute takes a fast path;
* :mod:`~torchplace.sanitizer.dispatch_mode`: a torch-dispatch mode pushed only around the
  other calls, which sees their copies and aten ops;
* :mod:`~torchplace.sanitizer.syncs`: what is a host sync and why, and the wrappers of
  ``torch.cuda.synchronize`` and friends, which no mode sees;
* :mod:`~torchplace.sanitizer.mixed`: ops whose operands sit on two devices;
* :mod:`~torchplace.sanitizer.sites`: a stack is looked at only when something is recorded, to
  find the user's line.

This module applies the guard's mode (record, warn, raise) and ``allow`` list to each event.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import FrameType, TracebackType
from typing import Any, TypeVar

import torch

from torchplace.errors import ConfigError, GuardViolation
from torchplace.sanitizer.dispatch_mode import DispatchLayer
from torchplace.sanitizer.events import KINDS, TRANSFER_KINDS, Event, GuardWarning, Operand, Site
from torchplace.sanitizer.function_mode import FunctionLayer
from torchplace.sanitizer.report import (
    DEFAULT_MAX_EVENTS,
    MODES,
    GuardReport,
    _site_matches,
    check_site_pattern,
)
from torchplace.sanitizer.sites import user_site
from torchplace.sanitizer.syncs import active_guards, install_sync_wrappers, remove_sync_wrappers

__all__ = ["Guard", "guard"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _parse_allow(allow: Iterable[str] | str | None) -> tuple[frozenset[str], tuple[str, ...]]:
    if allow is None:
        return frozenset(), ()
    if isinstance(allow, bytes | bytearray | memoryview):  # iterated, it gives ints
        raise ConfigError(
            f"allow={bytes(allow)!r:.80} is {type(allow).__name__}, not text: give an event kind or a "
            "'file.py:LINE' site as a str (allow='h2d'), or a list of them (allow=['h2d', "
            "'sync']); decode bytes first (value.decode())"
        )
    if isinstance(allow, Mapping):  # its keys would be read, its values ignored
        raise ConfigError(
            f"allow={allow!r:.80} is a mapping: allow= takes event kinds and 'file.py:LINE' "
            "sites as a str or a list of them (allow=['h2d', 'train.py:42']), not flags by name"
        )
    if not isinstance(allow, str) and not isinstance(allow, Iterable):
        raise ConfigError(
            f"allow must be an event kind, a 'file.py:LINE' site or a list of them, got {allow!r}"
        )
    items = (allow,) if isinstance(allow, str) else tuple(allow)
    kinds: set[str] = set()
    sites: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(
                f"allow entries must be non-empty strings (an event kind or 'file.py:LINE'), "
                f"got {item!r}"
            )
        if item in KINDS:
            kinds.add(item)
        elif item == "transfer":
            kinds |= TRANSFER_KINDS
        elif ".py" in item or ":" in item or "/" in item or item.startswith("<"):
            check_site_pattern(item, "allow entry")
            sites.append(item)
        else:
            raise ConfigError(
                f"allow entry {item!r} is neither an event kind ({', '.join(KINDS)}, transfer) "
                "nor a source location like 'train.py' or 'train.py:42'"
            )
    return frozenset(kinds), tuple(sites)


#: The guards watching new threads (``threads=True``), in the order they were entered: each
#: hook installed through :func:`threading.setprofile` chains to the one it replaced.
_thread_watchers: list[Guard] = []


def _remove_function_mode(layer: FunctionLayer) -> None:
    """Pop ``layer`` from this thread's torch-function mode stack wherever it sits.

    ``TorchFunctionMode.__exit__`` pops whatever mode is on top: a guard exited before a guard
    (or another mode) entered after it, as when a guarded generator finishes inside another
    guard, would pop that one and leave its own layer in place."""
    above = []
    while torch._C._len_torch_function_stack() > 0:
        mode = torch._C._pop_torch_function_stack()
        if mode is layer:
            break
        above.append(mode)
    for mode in reversed(above):
        torch._C._push_on_torch_function_stack(mode)


def _leave_when_the_thread_ends(stand_in: Guard) -> None:
    """Take ``stand_in``'s layer off its thread's torch-function mode stack as the thread ends.

    A mode left on a thread's stack is a Python object held by a C++ thread-local, destroyed
    when the OS thread exits: after ``join()`` has returned, and so possibly while (or after)
    the interpreter finalizes, which aborts the process ("terminate called without an active
    exception"). :mod:`threading` calls ``Thread._delete`` on the thread, with the interpreter
    running, after ``run`` returns or raises and before ``join()`` returns: the layer goes then.
    """
    thread = threading.current_thread()
    delete = getattr(thread, "_delete", None)
    if not callable(delete):  # a python without it: the layer stays, as before
        return
    layer = stand_in._function

    def _delete() -> None:
        try:
            _remove_function_mode(layer)
            guards = active_guards()
            if stand_in in guards:
                guards.remove(stand_in)
        except Exception:  # the thread is ending: never keep join() waiting over cleanup
            pass
        finally:
            delete()

    thread._delete = _delete  # type: ignore[attr-defined]


class Guard:
    """Records device crossings and host syncs on the thread that enters it and, with
    ``threads=True``, on the threads started (through :mod:`threading`) while it is active.

    Use it through :func:`guard`; entering returns the :class:`GuardReport` that fills up
    while the block runs. A guard can be entered again after it exits (events accumulate in the
    same report) but not twice at once. As a decorator it guards every call of a function
    (a call made while the guard is already active on its thread runs inside it), into the
    same report, which the wrapped function carries as ``report``.
    """

    def __init__(
        self,
        mode: str = "record",
        *,
        allow: Iterable[str] | str | None = None,
        max_events: int = DEFAULT_MAX_EVENTS,
        threads: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"guard mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not isinstance(threads, bool):
            raise ConfigError(f"threads must be True or False, got {threads!r}")
        self.mode = mode
        self.threads = threads
        self.allow_kinds, self.allow_sites = _parse_allow(allow)
        self.report = GuardReport(mode, max_events=max_events)
        self._function = FunctionLayer(self)
        self._dispatch = DispatchLayer(self)
        self._suppress_syncs = 0
        self._transfers_seen = 0
        self._mixed_seen = 0  # mixed-device ops seen on this thread, allowed ones included
        self._warned: set[tuple[Site, str]] = set()
        self._thread: int | None = None
        self._live = [False]  # shared with the guard's stand-ins on other threads
        self._violations = [0]  # GuardViolations raised, on any thread (shared like _live)
        self._saved_profile: Any = None

    # -- decorator ---------------------------------------------------------------------------
    def __call__(self, func: _F) -> _F:
        if not callable(func):
            raise ConfigError(f"guard() decorates a function, got {func!r}")
        if (
            inspect.isgeneratorfunction(func)
            or inspect.iscoroutinefunction(func)
            or (inspect.isasyncgenfunction(func))
        ):
            raise ConfigError(
                f"guard() cannot decorate {getattr(func, '__qualname__', func)!r}: a generator or "
                "coroutine runs after the call returns; use `with torchplace.guard():` inside it"
            )

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self._thread == threading.get_ident():  # a recursive or nested call
                return func(*args, **kwargs)
            with self:
                return func(*args, **kwargs)

        guarded.report = self.report  # type: ignore[attr-defined]
        return guarded  # type: ignore[return-value]

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> GuardReport:
        if self._thread is not None:
            raise ConfigError("this guard is already active; create another torchplace.guard()")
        self._thread = threading.get_ident()
        self._live = [True]  # a new cell: stand-ins left from an earlier entry stay silent
        install_sync_wrappers()
        active_guards().append(self)
        self._function.__enter__()  # type: ignore[no-untyped-call]
        if self.threads:
            self._saved_profile = threading.getprofile()
            threading.setprofile(self._join_new_thread)
            _thread_watchers.append(self)
        return self.report

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread != threading.get_ident():  # never entered, exited twice, or elsewhere
            where = "not active" if self._thread is None else "active on another thread"
            raise ConfigError(
                f"this guard is {where}: exit it once, on the thread that entered it "
                "(use `with torchplace.guard():`)"
            )
        self._live[0] = False
        if self.threads:
            self._unhook_threads()
        try:
            _remove_function_mode(self._function)
        finally:
            guards = active_guards()
            if self in guards:
                guards.remove(self)
            remove_sync_wrappers()
            self._thread = None

    def _unhook_threads(self) -> None:
        """Put back the thread hook this guard replaced. A guard may exit before one entered
        after it (a guard in a generator that finishes inside another guard): that one's hook
        stays, and restores this guard's predecessor when it exits in turn."""
        hook = self._join_new_thread
        if threading.getprofile() == hook:
            threading.setprofile(self._saved_profile)
        else:
            for later in _thread_watchers:
                if later._saved_profile == hook:
                    later._saved_profile = self._saved_profile
        _thread_watchers.remove(self)

    def _join_new_thread(self, frame: FrameType, event: str, arg: object) -> None:
        """The profile hook :mod:`threading` installs in each thread it starts: it removes
        itself and puts a stand-in for this guard on the new thread, with its own layers and
        per-thread counts, recording into the same report until the guard exits."""
        sys.setprofile(self._saved_profile)
        if not self._live[0]:
            return
        stand_in = copy.copy(self)  # shares the report, settings, warned lines and live cell
        stand_in._function = FunctionLayer(stand_in)
        stand_in._dispatch = DispatchLayer(stand_in)
        stand_in._suppress_syncs = stand_in._transfers_seen = stand_in._mixed_seen = 0
        stand_in._thread = threading.get_ident()
        active_guards().append(stand_in)
        stand_in._function.__enter__()  # type: ignore[no-untyped-call]
        _leave_when_the_thread_ends(stand_in)

    @property
    def violations(self) -> int:
        """How many :class:`~torchplace.errors.GuardViolation` this guard raised (``"raise"``
        mode), on every thread it watches: one a thread swallowed or died of counts too."""
        return self._violations[0]

    def __repr__(self) -> str:
        return f"Guard(mode={self.mode!r}, events={len(self.report)})"

    # -- recording -----------------------------------------------------------------------------
    def _transfer(
        self,
        direction: str,
        op: str,
        nbytes: int,
        src: torch.device,
        dst: torch.device,
        non_blocking: bool,
        *,
        after: bool = False,
    ) -> None:
        self._transfers_seen += 1
        detail = "non_blocking=True" if non_blocking else ""
        if after:
            detail = "copied from host data inside the factory"
        self._emit(direction, op, nbytes=nbytes, src=str(src), dst=str(dst), detail=detail)

    def _sync(self, op: str, why: str) -> None:
        if self._suppress_syncs:
            return
        self._emit("sync", op, detail=why)

    def _emit(
        self,
        kind: str,
        op: str,
        *,
        nbytes: int = 0,
        src: str | None = None,
        dst: str | None = None,
        detail: str = "",
        operands: tuple[Operand, ...] = (),
    ) -> None:
        if kind == "mixed_device":
            self._mixed_seen += 1
        if kind in self.allow_kinds or not self._live[0]:
            return
        site = user_site()
        if self.allow_sites and any(_site_matches(site, p) for p in self.allow_sites):
            return
        event = Event(kind, site, op, nbytes, src, dst, detail, operands)
        self.report.add(event)
        if self.mode == "warn":
            key = (site, kind)
            if key not in self._warned:
                self._warned.add(key)
                _warn(f"torchplace guard: {event.describe()}", site)
        elif self.mode == "raise":
            self._violations[0] += 1
            raise GuardViolation(
                f"{event.describe()}\n(torchplace guard in mode='raise'; to permit it pass "
                f"allow=[{kind!r}] or allow=[{site.short!r}]; on the command line "
                f"--allow {kind} or --allow {site.short})"
            )


def _warn(message: str, site: Site) -> None:
    """Issue a :class:`GuardWarning` at the user's line, as a warning and never as an error:
    where a filter would raise it into the program (``PYTHONWARNINGS=error``, ``-W error``,
    ``warnings.simplefilter("error")``), it is shown instead, through ``warnings.showwarning``
    (on stderr, or into ``catch_warnings(record=True)`` and pytest's summary), so that watching
    a program never changes what it does. ``mode="raise"`` is the mode that stops at the op."""
    try:
        warnings.warn_explicit(message, GuardWarning, site.filename, site.lineno)
    except GuardWarning as raised:
        warnings.showwarning(raised, GuardWarning, site.filename, site.lineno)


def guard(
    mode: str = "record",
    *,
    allow: Iterable[str] | str | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
    threads: bool = False,
) -> Guard:
    """Watch the current thread for device crossings and host syncs (with ``threads=True``,
    also the threads the block starts).

    ``mode``: ``"record"`` (default) only records; ``"warn"`` also issues a
    :class:`~torchplace.sanitizer.events.GuardWarning` once per new (line, kind), pointing at the
    line (shown, never raised into the program, where a filter says ``"error"``); ``"raise"``
    raises :class:`~torchplace.errors.GuardViolation` at the op, before it runs.
    ``allow``: event kinds (``"h2d"``, ``"d2h"``, ``"d2d"``, ``"transfer"``, ``"sync"``,
    ``"pageable_non_blocking"``, ``"mixed_device"``) and/or source locations (``"train.py"``,
    ``"train.py:42"``, ``"train.py:42:step"``) whose events are ignored entirely.
    ``max_events``: how many events the report keeps one by one (counts and bytes go on).
    ``threads``: also watch every thread started through :mod:`threading` (thread pools
    included) while the guard is active, into the same report; threads that already run are
    not watched.

    ::

        with torchplace.guard() as report:
            answer = model(batch.to(device)).argmax(-1).cpu().tolist()
        print(report.h2d_bytes, len(report.syncs))
        print(report)  # a table: line, kind, count, bytes

    It also decorates a function, guarding each of its calls into one report::

        @torchplace.guard()
        def step(batch): ...
        print(step.report)
    """
    return Guard(mode, allow=allow, max_events=max_events, threads=threads)
