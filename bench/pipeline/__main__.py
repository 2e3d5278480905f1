"""`.venv/bin/python -m bench.pipeline [--rollouts N] [--chains N] [--agent-rollouts N]`."""

from __future__ import annotations

import sys

from bench.pipeline.run import main

if __name__ == "__main__":
    sys.exit(main())
