"""The call store's retention: daily partitions of `llm_calls`, prune with export, upkeep loop.

See docs/operations.md ("Call retention") for the rule and the commands.
"""
