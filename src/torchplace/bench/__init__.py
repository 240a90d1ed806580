"""Honest timing on any device, and the ``torchplace bench`` benchmarks.

Import the submodule you need; this package imports nothing on its own.

Modules:

* ``timer``: :class:`~torchplace.bench.timer.Timer` and ``measure``: the cold call apart,
  warm-up, counts from a time budget, the spread warning;
* ``clocks``: what per-call times are measured with (the host clock, or device events read
  after one synchronisation);
* ``measurement``: :class:`~torchplace.bench.measurement.Measurement`, warm times and their
  statistics;
* ``timing``, ``transfer``, ``overlap``, ``stages``: the benchmarks (one product timed three
  ways; copy bandwidth; copies hidden behind compute; per-stage times of a model);
* ``link``: the theoretical peak of a GPU's PCIe link;
* ``units``: durations, byte counts and rates, formatted and parsed;
* ``memory``: free host and device memory, and refusing a run that cannot fit in it;
* ``render``, ``plot``: the results as tables and PNG charts;
* ``cli``: the ``torchplace bench`` command.
"""

from __future__ import annotations

__all__: list[str] = []
