"""Test doubles shaped exactly like the real components (a vLLM-shaped fake upstream, sinks).

They live in the package, not under `tests/`, so benchmarks, the demo and other projects' end-to-end
tests can start the same fake engine (`python -m polar_mq.testing.fake_vllm`).
"""
