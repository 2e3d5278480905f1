"""The proxy's line per call, written from the call rows it already builds (a sink wrapper).

Every proxied call becomes a row for the call store; `CallLogSink` logs it on its way there:
at DEBUG for every call, INFO for a rollout's first call (seq 0: the rollout reached the
model), WARNING for a call that failed or did not complete. The request path stays cheap at the
default INFO level: one level check per call, a formatted line once per rollout.
"""

from __future__ import annotations

import logging
from typing import Any

from polar_mq.proxy.store.sink import SinkWrapper

log = logging.getLogger("polar_mq.proxy.calls")


class CallLogSink(SinkWrapper):
    """Logs each call row (with its rollout's fields), then hands it to `inner`."""

    def submit(self, row: dict[str, Any]) -> None:
        failed = row.get("status_code", 200) >= 400 or not row.get("complete", True)
        level = (
            logging.WARNING if failed else logging.INFO if row.get("seq") == 0 else logging.DEBUG
        )
        if log.isEnabledFor(level):
            log.log(
                level,
                "call %s: %s %s, %.0f ms, %s+%s tokens, backend %s, policy v%s",
                row.get("seq"), row.get("api_type"), row.get("status_code"),
                row.get("latency_ms") or 0.0, len(row.get("prompt_ids") or ()),
                len(row.get("completion_ids") or ()), row.get("backend") or "-",
                row.get("policy_version"),
                extra={"rollout_id": str(row.get("rollout_id")), "attempt": row.get("attempt")},
            )  # fmt: skip
        self.inner.submit(row)
