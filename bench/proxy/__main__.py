"""`.venv/bin/python -m bench.proxy [--duration S] [--repeats N] [--clients 64]`."""

from __future__ import annotations

import sys

from bench.proxy.run import main

if __name__ == "__main__":
    sys.exit(main())
