"""Per-rollout capability tokens handed to agents (and judges) as their API key.

A token names exactly one rollout, an expiry and a purpose, signed with HMAC-SHA256 under the shared
secret, so the proxy can authenticate a call without a database round trip and an agent cannot
speak for another rollout. The purpose tells the proxy how to mark the calls it logs: `agent` calls
feed training samples, `judge` calls (an `llm_judge` evaluator scoring the rollout) are stored for
audit but never trained on.

A token may also name the rollout's attempt, so the proxy logs every call under the attempt
that made it: when a lost attempt is restarted, a straggling process of the old attempt (killed
moments later by the node janitor) cannot slip calls into the new attempt's trajectory.

Formats (purpose and attempt are inside the signed payload, so they cannot be swapped):
- agent: `pmq_<rollout uuid hex>_<expiry unix seconds>_<signature hex>` (the original format,
  so tokens issued before purposes existed keep working and agent tokens stay as short);
- other purposes: `pmq_<rollout uuid hex>_<expiry>_<purpose>_<signature hex>`;
- with an attempt: `pmq_<rollout uuid hex>_<expiry>_<purpose>_<attempt>_<signature hex>`;
- with a sampling policy (`polar_mq.capability.sampling`, enforced by the proxy on every call):
  `pmq_<rollout uuid hex>_<expiry>_<purpose>_<attempt or empty>_<policy>_<signature hex>`, the
  policy being the hex of the JSON `{field code: [mode code, value]}` (codes: `t` temperature,
  `p` top_p, `k` top_k, `m` max_tokens; `o` override, `c` clamp; `x: ["o", 1]` for
  `exact`), e.g. 60 characters for a temperature override and a max_tokens clamp. A proxy that
  predates a code refuses the token rather than enforce less than the job asked. Tokens
  without a policy keep the formats above.
- with call receipts (`polar_mq.capability.receipts`: the proxy must count the attempt's calls in
  Redis, or refuse them): the attempt segment ends in `r` (`..._agent_2r_...`); a proxy that
  predates receipts cannot parse it and refuses the token, never serving uncounted calls.
- for a job without a token budget (`max_tokens_per_rollout`, `proxy.token_budget`): the attempt
  segment ends in `n` (`..._agent_2n_...`, `..._agent_2rn_...`), so the proxy does not look the
  budget up in the database on the attempt's first call. A token without the mark is read as
  before: its budget is looked up.
- for a job with `tito: off` (`polar_mq.proxy.tito`): the attempt segment ends in `c`
  (`..._agent_2c_...`, `..._agent_2rnc_...`): every call of the attempt goes the chat way. A proxy
  that predates the mark refuses the token rather than serve the job token-in against its wish.

Marks follow the attempt number in the order `r`, `n`, `c`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

import orjson

from polar_mq.capability.sampling import CLAMP, OVERRIDE, SamplingPolicy, SamplingRule, is_number

PREFIX = "pmq"
AGENT: Final = "agent"
JUDGE: Final = "judge"
PURPOSES = frozenset({AGENT, JUDGE})
"""Every purpose a token may carry; also the values of `llm_calls.purpose`."""


class InvalidToken(ValueError):
    """The token is malformed, forged or expired."""


@dataclass(frozen=True, slots=True)
class RolloutClaim:
    rollout_id: uuid.UUID
    expires_at: int
    purpose: str = AGENT
    attempt: int | None = None
    """The rollout attempt the token was issued for (None: tokens issued without one)."""
    sampling: SamplingPolicy | None = None
    """The job's sampling policy the proxy enforces (None: tokens issued without one)."""
    receipts: bool = False
    """The proxy counts this attempt's calls in Redis (`call_receipts`) or refuses them."""
    unbudgeted: bool = False
    """The job sets no token budget: the proxy need not look one up (`proxy.token_budget`)."""
    chat_only: bool = False
    """The job turned token-in/token-out off (`tito: off`): every call goes the chat way."""


RECEIPTS_MARK: Final = "r"
UNBUDGETED_MARK: Final = "n"
CHAT_ONLY_MARK: Final = "c"
_MARK_ORDER: Final = (RECEIPTS_MARK, UNBUDGETED_MARK, CHAT_ONLY_MARK)
_ATTEMPT_MARKS: Final = frozenset(
    "".join(m for i, m in enumerate(_MARK_ORDER) if bits >> i & 1)
    for bits in range(1 << len(_MARK_ORDER))
)
"""The mark suffixes an attempt segment may carry, each in the one order of `_MARK_ORDER`."""
FIELD_CODES: Final = {"temperature": "t", "top_p": "p", "top_k": "k", "max_tokens": "m"}
MODE_CODES: Final = {OVERRIDE: "o", CLAMP: "c"}
_FIELDS_OF = {code: field for field, code in FIELD_CODES.items()}
_MODES_OF = {code: mode for mode, code in MODE_CODES.items()}
EXACT_CODE: Final = "x"
_EXACT_RULE: Final = ["o", 1]


def _sign(secret: str, payload: str) -> str:
    return hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()[:32]


def encode_policy(policy: SamplingPolicy) -> str:
    """The token segment of a non-empty policy (hex: no `_`, safe in URLs and headers)."""
    doc: dict[str, list[Any]] = {
        FIELD_CODES[rule.field]: [MODE_CODES[rule.mode], rule.value] for rule in policy
    }
    if policy.exact:
        doc[EXACT_CODE] = _EXACT_RULE
    return orjson.dumps(doc).hex()


def decode_policy(segment: str) -> SamplingPolicy:
    """The policy of a token segment; raises `InvalidToken` when it is not one we write."""
    try:
        doc: Any = orjson.loads(bytes.fromhex(segment))
    except ValueError as exc:  # bad hex or bad JSON (orjson.JSONDecodeError is a ValueError)
        raise InvalidToken("malformed rollout token") from exc
    if not isinstance(doc, dict) or not doc:
        raise InvalidToken("malformed rollout token")
    exact = EXACT_CODE in doc
    if exact and doc.pop(EXACT_CODE) != _EXACT_RULE:
        raise InvalidToken("malformed rollout token")
    rules = []
    for code, rule in doc.items():
        ok = code in _FIELDS_OF and isinstance(rule, list) and len(rule) == 2
        if not ok or rule[0] not in _MODES_OF or not is_number(rule[1]):
            raise InvalidToken("malformed rollout token")
        rules.append(SamplingRule(_FIELDS_OF[code], _MODES_OF[rule[0]], rule[1]))
    return SamplingPolicy(tuple(rules), exact)


def issue_rollout_token(
    secret: str,
    rollout_id: uuid.UUID,
    ttl_s: int,
    purpose: str = AGENT,
    attempt: int | None = None,
    sampling: SamplingPolicy | None = None,
    receipts: bool = False,
    unbudgeted: bool = False,
    chat_only: bool = False,
) -> str:
    """A token for `rollout_id` valid for `ttl_s` seconds, for calls made with `purpose`.

    A non-empty `sampling` policy is signed into the token; without one the token is as short as
    before policies existed. `receipts` (needs an `attempt`) asks the proxy to count the calls;
    `unbudgeted` (needs an `attempt`) tells it the job has no token budget to look up;
    `chat_only` (needs an `attempt`) keeps every call off token-in/token-out (`tito: off`).
    """
    if purpose not in PURPOSES:
        raise ValueError(f"unknown token purpose {purpose!r}; known: {', '.join(sorted(PURPOSES))}")
    if attempt is not None and attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if receipts and attempt is None:
        raise ValueError("call receipts are kept per attempt: give the attempt")
    if (unbudgeted or chat_only) and attempt is None:
        raise ValueError("the budget and chat-only marks are carried by the attempt: give it")
    chosen = (receipts, unbudgeted, chat_only)
    marks = "".join(mark for mark, on in zip(_MARK_ORDER, chosen, strict=True) if on)
    attempt_text = None if attempt is None else f"{attempt}{marks}"
    payload = f"{PREFIX}_{rollout_id.hex}_{int(time.time()) + ttl_s}"
    if sampling:
        attempt_part = attempt_text or ""
        payload = f"{payload}_{purpose}_{attempt_part}_{encode_policy(sampling)}"
    elif attempt_text is not None:
        payload = f"{payload}_{purpose}_{attempt_text}"
    elif purpose != AGENT:
        payload = f"{payload}_{purpose}"
    return f"{payload}_{_sign(secret, payload)}"


def verify_rollout_token(secret: str, token: str, now: float | None = None) -> RolloutClaim:
    """The claim a genuine, unexpired token carries; raises `InvalidToken` otherwise."""
    parts = token.split("_")
    if len(parts) not in (4, 5, 6, 7) or parts[0] != PREFIX:
        raise InvalidToken("malformed rollout token")
    payload = "_".join(parts[:-1])
    if not hmac.compare_digest(_sign(secret, payload), parts[-1]):
        raise InvalidToken("bad rollout token signature")
    purpose = parts[3] if len(parts) >= 5 else AGENT
    if purpose not in PURPOSES or (len(parts) == 5 and purpose == AGENT):
        raise InvalidToken("malformed rollout token")  # signed, but by a newer or odd issuer
    attempt_part = parts[4] if len(parts) == 6 or (len(parts) == 7 and parts[4]) else None
    marks = ""
    if attempt_part is not None:
        digits = attempt_part.rstrip("".join(_MARK_ORDER))
        attempt_part, marks = digits, attempt_part[len(digits) :]
        if marks not in _ATTEMPT_MARKS:  # signed, but not an order this issuer writes
            raise InvalidToken("malformed rollout token")
    try:
        rollout_id = uuid.UUID(hex=parts[1])
        expires_at = int(parts[2])
        attempt = int(attempt_part) if attempt_part is not None else None
    except ValueError as exc:
        raise InvalidToken("malformed rollout token") from exc
    sampling = decode_policy(parts[5]) if len(parts) == 7 else None
    if expires_at < (time.time() if now is None else now):
        raise InvalidToken("rollout token expired")
    if attempt is not None and attempt < 1:
        raise InvalidToken("malformed rollout token")
    receipts = RECEIPTS_MARK in marks
    unbudgeted = UNBUDGETED_MARK in marks
    chat_only = CHAT_ONLY_MARK in marks
    return RolloutClaim(
        rollout_id, expires_at, purpose, attempt, sampling, receipts, unbudgeted, chat_only
    )
