"""Runtime benchmarks (`python -m bench.runtimes.tag_scan`)."""
