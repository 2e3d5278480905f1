"""The proxy's per-process resources, created in the app lifespan and kept on `app.state.proxy`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from polar_mq.proxy.apis.response_store import ResponseStore
from polar_mq.proxy.backends import BackendPool
from polar_mq.proxy.engines import vllm
from polar_mq.proxy.engines.base import Engine
from polar_mq.proxy.metrics import ProxyMetrics
from polar_mq.proxy.rollout_states import RolloutStates
from polar_mq.proxy.server.auth import RolloutAuth
from polar_mq.proxy.server.fanout import Siblings
from polar_mq.proxy.store.receipts import StartCounter
from polar_mq.proxy.store.seq import Sequencer
from polar_mq.proxy.store.writer import CallSink
from polar_mq.proxy.token_budget import TokenBudgets

if TYPE_CHECKING:
    from polar_mq.proxy.tito import Tito


@dataclass(slots=True)
class ProxyState:
    backends: BackendPool
    """The upstreams, each with its pooled client; calls go through `backends.send_call`."""
    sink: CallSink
    auth: RolloutAuth
    seqs: Sequencer
    """Each rollout's call numbers (`seq`): this process's own, or shared through Redis."""
    served_model: str | None
    max_body_bytes: int
    admin_token: str | None
    engine: Engine = vllm
    """Token capture of the upstream engine (`engines.get_engine(settings.upstream_engine)`)."""
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    responses: ResponseStore = field(default_factory=ResponseStore)
    """OpenAI Responses this process answered (for `previous_response_id`)."""
    started_at: float = field(default_factory=time.time)
    """When this proxy process started (epoch s): a run-agent stage whose agent started before it
    knows the proxy restarted under it (an infrastructure failure, not the policy's)."""
    rollouts: RolloutStates | None = None
    """Which rollouts may still call (None: not checked, the proxy has no database)."""
    budgets: TokenBudgets | None = None
    """Each rollout attempt's completion-token budget (None: not enforced, no database)."""
    siblings: Siblings | None = None
    """The other processes of a `--workers N` proxy, which admin calls reach too (`fanout`)."""
    body_read_timeout_s: float | None = None
    """The deadline of an agent's request body (`body.read_json_object`); None: none (tests)."""
    receipts: StartCounter | None = None
    """Counts receipted calls before they are numbered (`receipts`); None: no Redis for it."""
    durable_answers: bool = True
    """An answer waits for its call's row to survive a crash (`CallSink.durable`); False:
    answer first (`POLAR_MQ_PROXY_DURABLE_ANSWERS=false`), whatever the sink."""
    tito: Tito | None = None
    """Token-in/token-out for chat calls (`polar_mq.proxy.tito`); None: every call goes chat."""
