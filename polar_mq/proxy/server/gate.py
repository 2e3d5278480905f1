"""Who may call the proxy: a genuine, unexpired token of a rollout that has not ended.

Every route that serves an agent (chat, completions, models, tokenize and each API family) asks
`admit` once, before reading the body: the token is checked from the headers alone
(`polar_mq.proxy.server.auth`), then the rollout's state from the proxy's small cache
(`polar_mq.proxy.rollout_states`). A refusal carries its status (401 bad token or unknown
rollout, 403 rollout ended) so each family can answer it in its own error shape.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from polar_mq.capability.tokens import RolloutClaim
from polar_mq.observability.context import bind
from polar_mq.proxy.apis.base import AUTHENTICATION, PERMISSION
from polar_mq.proxy.errors import openai_error
from polar_mq.proxy.rollout_states import Refusal
from polar_mq.proxy.server.state import ProxyState

BAD_TOKEN = "invalid_api_key"


async def admit(request: Request) -> RolloutClaim | Refusal:
    """The caller's claim, or why it may not call."""
    state: ProxyState = request.app.state.proxy
    claim = state.auth.authenticate(request)
    if isinstance(claim, str):
        return Refusal(401, BAD_TOKEN, claim)
    bind(rollout_id=claim.rollout_id, attempt=claim.attempt)  # this request's log lines
    if state.rollouts is None:  # no database to ask (tests with an injected sink)
        return claim
    refused = await state.rollouts.refusal(claim.rollout_id)
    return claim if refused is None else refused


def kind_of(refusal: Refusal) -> str:
    """The error kind an API family maps to its own type (`apis.base`)."""
    return PERMISSION if refusal.status == 403 else AUTHENTICATION


def openai_refusal(refusal: Refusal) -> Response:
    """The refusal in OpenAI's shape (chat, completions, models, tokenize)."""
    return openai_error(refusal.status, refusal.message, "invalid_request_error", refusal.code)
