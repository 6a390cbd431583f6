"""Benchmarks run with pytest-benchmark: `python -m pytest bench/ --benchmark-only`.

Sizes shrink on a software adapter (lavapipe) so that a run takes minutes, not hours."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fusec  # noqa: E402


def pytest_report_header(config: object) -> str:
    return f"fusec device: {fusec.default_device()}"
