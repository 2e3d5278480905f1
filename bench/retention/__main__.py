"""`.venv/bin/python -m bench.retention [--calls 10000000] ...` (see bench/retention/run.py)."""

from bench.retention.run import main

main()
