"""Rollouts: read services for one rollout."""
