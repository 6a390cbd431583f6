"""``python -m fusec``: the same command line as the ``fusec`` script (see :mod:`fusec.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
