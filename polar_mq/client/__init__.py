"""Python clients of the REST API, for trainers: `Client` (sync) and `AsyncClient`.

Only httpx (and rich for the progress bar) is needed on the trainer's side; responses are plain
dicts shaped as the OpenAPI schema documents them. Every error is a `PolarMQError` with the API's
status, type and message.

Submitting is safe to retry: a submission without an `idempotency_key` gets a fresh one, so a retry
after a dropped connection returns the job the first attempt created instead of a second job.

Layout: every operation is written once in `core.py` / `leases.py` as a sans-IO generator
(`steps.py` describes the protocol); `operations.py` lists them once for both faces; `sync.py` and
`async_.py` are the two thin faces that carry the steps out over httpx.

A client without `api_key` uses `$POLAR_MQ_API_KEY` when it is set, as the `polar-mq` commands do.
"""

from polar_mq.client.async_ import AsyncClient
from polar_mq.client.core import page_rollouts
from polar_mq.client.errors import PolarMQError, Submission
from polar_mq.client.state import default_consumer, delivery_ids
from polar_mq.client.sync import Client

__all__ = [
    "AsyncClient",
    "Client",
    "PolarMQError",
    "Submission",
    "default_consumer",
    "delivery_ids",
    "page_rollouts",
]
