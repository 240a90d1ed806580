"""Triton's logging extension: the server's log settings, read and changed while it serves.

``GET /v2/logging`` (gRPC ``LogSettings`` without settings) answers the six settings Triton
defines; ``POST /v2/logging`` (``LogSettings`` with settings) changes the ones it names and
answers them all. A change is checked whole before any of it applies: one bad setting changes
nothing (Triton applies the settings before the bad one).

``log_info``, ``log_warning``, ``log_error`` (booleans)
    whether the server's INFO, WARNING and ERROR (with CRITICAL) records are written; each
    on its own, as in Triton (warnings off, errors on)
``log_verbose_level`` (an integer >= 0)
    above 0, DEBUG records are written too (torchplace has one verbose level; the number
    given is kept and answered back)
``log_format`` (``"default"`` or ``"ISO8601"``)
    ``ISO8601`` starts each line the handlers write with the UTC time
``log_file`` (a path; ``""`` is standard error)
    where the records go; read-only over the network, as in Triton (501, ``UNIMPLEMENTED``)

The levels govern the server's own loggers (``torchplace`` and below): their level is the
lowest one switched on, and a filter on the handlers they reach drops the levels switched
off above it. Nothing changes until the first ``POST``; :meth:`LogSettings.close` (the
server's shutdown) puts the level and the handlers' formatters back and takes the filter off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from torchplace.errors import InputError, UnsupportedSettingError

__all__ = ["SETTINGS", "LogSettings"]

#: Triton's log settings, in the order they are answered
SETTINGS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")
_FORMATS = ("default", "ISO8601")
_LOGGER = "torchplace"
_OFF = logging.CRITICAL + 1


class _Iso8601(logging.Formatter):
    """A handler's own lines (its formatter's, or the default one) with the UTC time first
    (``log_format`` ``ISO8601``)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        line = (self.inner or logging.Formatter()).format(record)
        return time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime(record.created)) + line


class LogSettings(logging.Filter):
    """The log settings of one server (see the module docstring); also the filter that drops
    the records of the levels switched off."""

    def __init__(self) -> None:
        super().__init__()
        self._changed: dict[str, Any] | None = None  # None: never changed, read the logger
        self._handlers: list[logging.Handler] = []
        self._level_before: int | None = None

    def document(self) -> dict[str, Any]:
        """The six settings, as ``GET /v2/logging`` answers them."""
        current = self._changed if self._changed is not None else self._from_logger()
        return {name: current[name] for name in SETTINGS}

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (a setting's name to its value; None leaves it as it is) and
        answer every setting; :class:`InputError` or :class:`~torchplace.errors.UnsupportedSettingError`, with
        nothing changed, for a setting that cannot take its value."""
        wanted = self.document()
        for name, value in changes.items():
            if value is not None:
                wanted[name] = _checked(name, value)
        if changes:
            self._apply(wanted)
        return self.document()

    def close(self) -> None:
        """Put the server's logger level back and take the filter off the handlers."""
        if self._level_before is not None:
            logging.getLogger(_LOGGER).setLevel(self._level_before)
            self._level_before = None
        for handler in self._handlers:
            handler.removeFilter(self)
        self._iso(False)
        self._handlers = []
        self._changed = None

    def filter(self, record: logging.LogRecord) -> bool:
        settings = self._changed
        name = record.name
        if settings is None or not (name == _LOGGER or name.startswith(_LOGGER + ".")):
            return True
        level = record.levelno
        if level >= logging.ERROR:
            return bool(settings["log_error"])
        if level >= logging.WARNING:
            return bool(settings["log_warning"])
        if level >= logging.INFO:
            return bool(settings["log_info"])
        return bool(settings["log_verbose_level"])

    # -- internals -------------------------------------------------------------------------
    def _from_logger(self) -> dict[str, Any]:
        logger = logging.getLogger(_LOGGER)
        level = logger.getEffectiveLevel()
        return {
            "log_file": _log_file(_reached(logger)),
            "log_info": level <= logging.INFO,
            "log_warning": level <= logging.WARNING,
            "log_error": level <= logging.ERROR,
            "log_verbose_level": int(level <= logging.DEBUG),
            "log_format": "default",
        }

    def _apply(self, wanted: dict[str, Any]) -> None:
        logger = logging.getLogger(_LOGGER)
        if self._level_before is None:
            self._level_before = logger.level
        if not self._handlers:
            self._handlers = _reached(logger)
            for handler in self._handlers:
                handler.addFilter(self)
        self._changed = wanted
        on = [
            level
            for level, key in ((logging.DEBUG, "log_verbose_level"), (logging.INFO, "log_info"),
                               (logging.WARNING, "log_warning"), (logging.ERROR, "log_error"))
            if wanted[key]
        ]  # fmt: skip
        logger.setLevel(min(on, default=_OFF))
        self._iso(wanted["log_format"] == "ISO8601")

    def _iso(self, on: bool) -> None:
        """Put :class:`_Iso8601` around the handlers' formatters (``on``), or take it off."""
        for handler in self._handlers:
            wrapped = isinstance(handler.formatter, _Iso8601)
            if on and not wrapped:
                handler.setFormatter(_Iso8601(handler.formatter))
            elif not on and isinstance(handler.formatter, _Iso8601):
                handler.setFormatter(handler.formatter.inner)


def _checked(name: str, value: Any) -> Any:
    """``value`` for the setting ``name``, or the error that says what it takes."""
    if name not in SETTINGS:
        raise InputError(
            f"unknown log setting {name[:100]!r}; the settings are {', '.join(SETTINGS)}"
        )
    if name == "log_file":
        raise UnsupportedSettingError(
            "log file location can not be updated through network protocol; the server's log "
            "goes where it was started to write it"
        )
    if name == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
            raise InputError(
                f"expect an integer from 0 to {2**31 - 1} for 'log_verbose_level', got "
                f"{value!r:.100}; send 0 (off) or 1 (DEBUG records on)"
            )
        return value
    if name == "log_format":
        if value not in _FORMATS:
            raise InputError(
                f'invalid argument for log_format, got: {value!r:.100}; send "default" or "ISO8601"'
            )
        return value
    if not isinstance(value, bool):
        raise InputError(f"expect boolean for {name!r}, got {value!r:.100}; send true or false")
    return value


def _reached(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of ``logger`` reaches (its own and its ancestors', while it
    propagates); standard error's last-resort handler when there are none."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found += [h for h in current.handlers if h not in found]
        current = current.parent if current.propagate else None
    if not found and logging.lastResort is not None:
        found.append(logging.lastResort)
    return found


def _log_file(handlers: list[logging.Handler]) -> str:
    """The file the records go to ("" for a stream such as standard error)."""
    for handler in handlers:
        if isinstance(handler, logging.FileHandler):
            return str(handler.baseFilename)
    return ""
