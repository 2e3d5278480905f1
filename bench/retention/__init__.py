"""Retention bench: prune, sizes and read p99 on millions of synthetic calls (bench/README.md)."""
