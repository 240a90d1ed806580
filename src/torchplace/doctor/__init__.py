"""``torchplace doctor``: check that torch really runs on a device, and report what is visible.

One module per concept, in the order a report is made:

- :mod:`~torchplace.doctor.probes`: the facts (build, settings, driver, toolkit, environment,
  visible devices), read once through a device probe into :class:`~torchplace.doctor.probes.Facts`;
- :mod:`~torchplace.doctor.checks`: the checks derived from the facts (:class:`Check`,
  :func:`arch_support`, the driver, visibility, per-device and resolve checks);
- :mod:`~torchplace.doctor.smoke`: the smoke tests run on the chosen device (pinned memory, a
  round trip, a matmul against a float64 reference);
- :mod:`~torchplace.doctor.verdict`: whether the requested device is usable, each cause and fix
  once;
- :mod:`~torchplace.doctor.assemble`: :func:`collect`, the whole report as one JSON-ready dict;
- :mod:`~torchplace.doctor.rendering`: :func:`render`, the report as tables for people;
- :mod:`~torchplace.doctor.cli`: the ``torchplace doctor`` command (``configure`` and ``run``).
"""

from torchplace.doctor.assemble import collect
from torchplace.doctor.checks import Check, arch_support
from torchplace.doctor.cli import configure, run
from torchplace.doctor.probes import nvcc_version
from torchplace.doctor.rendering import render
from torchplace.doctor.smoke import matmul_check, pinned_memory_check, round_trip_check

__all__ = [
    "Check",
    "arch_support",
    "collect",
    "configure",
    "matmul_check",
    "nvcc_version",
    "pinned_memory_check",
    "render",
    "round_trip_check",
    "run",
]
