"""bench/async: synchronous vs asynchronous (staleness-bounded) consumption of rollout groups."""
