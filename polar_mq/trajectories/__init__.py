"""Trajectory builders: LLM calls in, training samples out.

Sampled tokens are never re-tokenized.
"""
