"""Honest timing on any device: ``Timer``/``measure`` (``timer``), the ``torchplace bench``
benchmarks (``timing``, ``transfer``, ``overlap``, ``stages``), their tables (``render``) and
charts (``plot``). Import the submodule you need; this package imports nothing on its own.
"""

from __future__ import annotations

__all__: list[str] = []
