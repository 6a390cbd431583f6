"""Helpers more than one test module uses (tests/ is on sys.path under pytest's default import
mode, so test modules import this as ``helpers``)."""

from __future__ import annotations

from typing import Any

import fusec


class Delta:
    """cache_info() change over a block."""

    def __enter__(self) -> Delta:
        self.start = fusec.cache_info()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.d = fusec.cache_info() - self.start

    def __getattr__(self, name: str) -> int:
        return getattr(self.__dict__["d"], name)
