"""API families the proxy speaks besides chat/completions, each translated to the engine's chat.

`base` holds the interface, `route` the shared hot path, `registry` the routes of every family.
This package's `__init__` imports nothing, so the hot-path modules can import `apis.base`.
"""
