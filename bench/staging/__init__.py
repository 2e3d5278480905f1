"""Staging benchmark: agent-slot utilisation and rollouts/minute, sequential vs staged vs warm."""
