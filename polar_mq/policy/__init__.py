"""Asynchronous RL: the trainer's policy version, weight-update pauses and staleness control.

`state` reads and writes the current version; `proxies` pauses, drains, stamps and resumes every
proxy; `admission` holds a job's rollouts back until its staleness capacity allows them;
`staleness` keeps groups that are too old out of the stream; `service` ties an update together.
"""
