"""Inference servers that polar_mq can start itself (a real CPU vLLM for tests and the demo)."""
