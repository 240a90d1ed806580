"""Fixtures of the guard tests."""

from __future__ import annotations

pytest_plugins = ["pytester"]
