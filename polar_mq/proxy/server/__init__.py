"""The proxy as processes and an HTTP service: its own HTTP/1.1 server (`http_server`,
`http_conn`), the ASGI app and its routes (`app`, `routes`, `fast_path`), what every call passes
(`auth`, `body`, `gate`, `abort`, `state`), and serving it from one process or N (`serve`, `run`,
`supervisor`, `worker_slot`, `fanout`).

Nothing is imported here: a `--workers N` supervisor loads `run` and `supervisor` only.
"""
