"""`.venv/bin/python -m bench.async [--steps 12] [--batch-groups 4] [--samples 4] [--quick] ...`.

(`async` is a keyword, so the package's modules import each other relatively.)
"""

from __future__ import annotations

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
