"""Agents that ship with polar_mq; run as programs inside a runtime, never imported by workers."""
