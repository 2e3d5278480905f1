"""`.venv/bin/python -m bench.staging [--slots 4] [--rollouts 32] [--prepare-s 2] ...`."""

from __future__ import annotations

import sys

from bench.staging.run import main

if __name__ == "__main__":
    sys.exit(main())
