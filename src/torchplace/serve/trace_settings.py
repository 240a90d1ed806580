"""Triton's trace extension: the tracing of requests, read and changed while the server runs.

``GET /v2/trace/setting`` (gRPC ``TraceSetting`` without settings) answers the settings every
model follows unless it has its own; ``POST`` changes them. ``/v2/models/{name}/trace/setting``
(gRPC ``TraceSetting`` with ``model_name``) reads and changes one model's own settings. A
change is checked whole before any of it applies, and answered with every setting. Values are
strings, as in Triton:

``trace_level``
    ``["TIMESTAMPS"]``: record requests and their stages (the server's tracing, see
    :mod:`torchplace.serve.tracing`); ``TENSORS``: their input and output tensors (Triton's
    trace format, ``--trace-format triton``, only); ``["OFF"]``: record nothing.
``trace_rate``
    record one request in this many (a batch is recorded whole when it holds such a request)
``trace_count``
    how many more requests to record, per model version (``-1``: no limit); counts down as
    batches are recorded, the batch that reaches it whole
``log_frequency``
    ``0``: the trace file is written when the server stops; ``N``: every ``N`` traces are
    written to the next of ``FILE.0``, ``FILE.1``, ... (Triton's trace format,
    ``--trace-format triton``, only: a Chrome trace is written when the server stops). The
    file is the server's: its frequency is the one set last, the server's or a model's
``trace_file``, ``trace_mode``
    where the traces go (``--trace-file``) and how (``triton``: a trace file;
    ``opentelemetry``: an OpenTelemetry SDK); read-only over the network, as in Triton

A setting given ``null`` (REST) or no values (gRPC) goes back to the one above it: a model's to
the server's, the server's to its start-up value. Recording needs somewhere to write: a server
started without ``--trace-file`` (and no OpenTelemetry SDK) refuses ``TIMESTAMPS``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from torchplace.errors import InputError, UnsupportedSettingError
from torchplace.serve.tracing import Tracer

__all__ = ["SETTINGS", "TraceSettings", "from_json", "tracers"]

#: Triton's trace settings, in the order they are answered
SETTINGS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")
_CHANGEABLE = ("trace_level", "trace_rate", "trace_count", "log_frequency")
_LEVELS = ("TIMESTAMPS", "TENSORS")
_MAX_RATE = 2**32 - 1
_MAX_COUNT = 2**31 - 1


class TraceSettings:
    """The server's trace settings and each model's own (see the module docstring)."""

    def __init__(self, trace_file: Path | str | None = None) -> None:
        #: the server's ``--trace-file`` (each version writes its own beside it when several
        #: are served), what the server's settings name
        self.trace_file = "" if trace_file is None else str(trace_file)
        self._server: dict[str, Any] = {}
        self._models: dict[str, dict[str, Any]] = {}
        self._given: weakref.WeakSet[Tracer] = weakref.WeakSet()  # tracers told the settings

    def document(
        self, found: Mapping[str, list[Tracer]], model: str | None = None
    ) -> dict[str, Any]:
        """The settings of ``model`` (None: the server's), as Triton answers them; ``found``:
        every model's tracers, by model name (they say where traces go)."""
        tracers = found.get(model, []) if model else [t for f in found.values() for t in f]
        current = self._effective(tracers, model)
        live = [t.count for t in tracers] if model is not None and tracers else []
        count = live[0] if live else current["trace_count"]
        own = next((str(t.trace_file) for t in tracers if t.trace_file), "")
        return {
            "trace_file": own if model is not None else self.trace_file or own,
            "trace_level": list(current["trace_level"]) or ["OFF"],
            "trace_rate": str(current["trace_rate"]),
            "trace_count": str(count),
            "log_frequency": str(current["log_frequency"]),
            "trace_mode": "opentelemetry" if any(t.exports_spans for t in tracers) else "triton",
        }

    def update(
        self,
        changes: Mapping[str, list[str] | None],
        tracers: Mapping[str, list[Tracer]],
        model: str | None = None,
    ) -> dict[str, Any]:
        """Apply ``changes`` (a setting's name to its values, None to clear it) to ``model``'s
        settings (None: the server's), then to the tracers of every model (``tracers``, by
        model name); answer the settings. :class:`InputError` or
        :class:`~torchplace.errors.UnsupportedSettingError`, nothing changed, for
        a setting that cannot take its values."""
        checked = {name: _checked(name, values) for name, values in changes.items()}
        every = [t for found in tracers.values() for t in found]
        levels = checked.get("trace_level") or ()
        if levels and not any(t.can_record for t in every):
            raise InputError(
                f"trace_level {levels[0]} has nowhere to write: start the server with "
                "--trace-file FILE.json (or with an OpenTelemetry SDK tracer provider)"
            )
        if "TENSORS" in levels and not all(t.triton_format for t in every if t.can_record):
            raise InputError(
                "trace_level TENSORS records tensor data in Triton's trace file, which this "
                "server does not write; send TIMESTAMPS, or start it with --trace-file FILE "
                "--trace-format triton"
            )
        frequency = checked.get("log_frequency")
        if frequency and any(t.trace_file and not t.triton_format for t in every):
            raise InputError(
                f"'log_frequency' {frequency} writes Triton's trace files (FILE.0, FILE.1, ...), "
                "and this server writes a Chrome trace, when it stops; send 0, or start it "
                "with --trace-format triton"
            )
        target = self._server if model is None else self._models.setdefault(model, {})
        for name, value in checked.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = value
        for name, found in tracers.items():
            if model is None or name == model:
                for tracer in found:
                    tracer.seal()  # the traces so far are the earlier settings'
                self.apply(name, found, reset_count="trace_count" in checked)
        return self.document(tracers, model)

    def adopt(self, tracers: Mapping[str, list[Tracer]]) -> None:
        """Give the tracers of models loaded since the last call their model's settings (the
        registry changed); the others keep theirs, their count as far as it got."""
        if not self._server and not self._models:
            return  # nothing changed: every tracer runs as it started
        for name, found in tracers.items():
            self.apply(name, [t for t in found if t not in self._given])

    def apply(self, model: str, tracers: Iterable[Tracer], reset_count: bool = True) -> None:
        """Give ``model``'s tracers its settings; ``reset_count``: restart their
        ``trace_count`` from the setting (else they keep what is left of it)."""
        tracers = list(tracers)
        current = self._effective(tracers, model)
        for tracer in tracers:
            count = current["trace_count"] if reset_count else tracer.count
            tracer.configure(
                on="TIMESTAMPS" in current["trace_level"],
                tensors="TENSORS" in current["trace_level"],
                rate=current["trace_rate"],
                count=count,
                log_frequency=current["log_frequency"],
            )
            self._given.add(tracer)

    def _effective(self, tracers: list[Tracer], model: str | None) -> dict[str, Any]:
        start = {
            "trace_level": ("TIMESTAMPS",) if any(t.can_record for t in tracers) else (),
            "trace_rate": 1,
            "trace_count": -1,
            "log_frequency": 0,
        }
        return {**start, **self._server, **(self._models.get(model, {}) if model else {})}


def tracers(registry: Any) -> dict[str, list[Tracer]]:
    """The tracers of every loaded model version, by model name (engines without one, such
    as a test's stand-in, left out)."""
    found: dict[str, list[Tracer]] = {}
    for handle in registry.handles():
        tracer = getattr(handle.engine, "tracer", None)
        if isinstance(tracer, Tracer):
            found.setdefault(handle.name, []).append(tracer)
    return found


def from_json(body: Mapping[str, Any]) -> dict[str, list[str] | None]:
    """A REST body's settings as lists of strings (None: ``null``, clear it), as gRPC sends
    them; a number for a count or rate is taken as its digits."""
    found: dict[str, list[str] | None] = {}
    for name, value in body.items():
        if value is None:
            found[name] = None
        elif name == "trace_level":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise InputError(
                    f"'trace_level' must be an array of strings, got {value!r:.100}; send "
                    '["TIMESTAMPS"] or ["OFF"]'
                )
            found[name] = value
        elif isinstance(value, int) and not isinstance(value, bool):
            found[name] = [str(value)]
        elif isinstance(value, str):
            found[name] = [value]
        else:
            found[name] = [repr(value)]  # refused by _checked, which names it
    return found


def _checked(name: str, values: list[str] | None) -> Any:
    """The setting ``name`` given ``values``: its value (None: cleared), or the error."""
    if name in ("trace_file", "trace_mode"):
        if name == "trace_file":
            raise UnsupportedSettingError(
                "trace file location can not be updated through network protocol; traces go "
                "to the --trace-file the server was started with"
            )
        raise UnsupportedSettingError(
            "trace mode can not be updated through network protocol; it follows how the "
            "server was started (--trace-file, or an OpenTelemetry SDK)"
        )
    if name not in _CHANGEABLE:
        raise InputError(
            f"unknown trace setting {name[:100]!r}; the settings are {', '.join(SETTINGS)}"
        )
    if values is None or not values:
        return None
    if name == "trace_level":
        return _level(values)
    if len(values) != 1:
        raise InputError(f"{name!r} takes one value, got {len(values)}")
    return _integer(name, values[0])


def _level(values: list[str]) -> tuple[str, ...]:
    """The levels recorded (none: ``OFF``), in Triton's order."""
    if "OFF" in values:
        if len(values) != 1:
            raise InputError("Expect only one trace level 'OFF' is specified")
        return ()
    for value in values:
        if value not in _LEVELS:
            raise InputError(
                f'unknown trace level {value[:100]!r}; send ["TIMESTAMPS"], '
                '["TIMESTAMPS", "TENSORS"] or ["OFF"]'
            )
    return tuple(level for level in _LEVELS if level in values)


def _integer(name: str, text: str) -> int:
    """``text`` as ``name``'s integer, in its range, with Triton's words when it is not."""
    low, high = {"trace_rate": (1, _MAX_RATE), "trace_count": (-1, _MAX_COUNT)}.get(
        name, (0, _MAX_COUNT)
    )
    try:
        value = int(text, 10)
    except ValueError:
        raise InputError(f"Unable to parse {name!r}, got: {text[:100]}") from None
    if not low <= value <= high:
        raise InputError(
            f"Unable to parse {name!r}. Expecting value >= {low} (and at most {high}), "
            f"got: {text[:100]}"
        )
    return value
