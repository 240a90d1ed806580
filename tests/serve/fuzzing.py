"""The settings every differential fuzz test of the server shares: reproducible runs (the same
examples each time, nothing kept between runs), no per-example deadline on a shared machine."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

#: 200 generated cases a test, the same ones every run
FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
