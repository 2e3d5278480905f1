"""Benchmarks: each one a module run as `python -m bench.<name>`, printing figures and ratios
against a baseline measured in the same run (see bench/README.md)."""
