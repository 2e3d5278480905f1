"""Every domain error is answered by the one `PolarError` handler, byte for byte as before.

`ANSWERS` was recorded from the API of main d1bb0a7, which had one handler per exception type:
status, body bytes and headers (in order) of each domain error, plus the database's two. The one
handler must give exactly these; a new domain error needs a row here (the last test says so).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.orm import sessionmaker

from polar_mq.api.errors import ApiError, install_error_handlers
from polar_mq.config import Settings
from polar_mq.dispatch.submit import IdempotencyConflict, UnstorableValue
from polar_mq.infra.errors import NotFound, PolarError
from polar_mq.jobs.deliveries import DeliveryConflict, UnknownDelivery
from polar_mq.jobs.read_models import InvalidCursor
from polar_mq.policy.state import AdapterChanged, VersionWentBack
from polar_mq.tenants.floors import FloorViolation
from polar_mq.tenants.quotas import QuotaExceeded
from polar_mq.ui.app import create_app

J = uuid.UUID(int=7)
JSON = [("content-type", "application/json")]


def _length(n: int) -> list[tuple[str, str]]:
    return [("content-length", str(n)), *JSON]


ANSWERS: dict[str, tuple[Callable[[], Exception], int, bytes, list[tuple[str, str]]]] = {
    "not_found": (
        lambda: NotFound("job", J),
        404,
        b'{"error":{"type":"not_found","message":"job 00000000-0000-0000-0000-000000000007 '
        b'not found"}}',
        _length(93),
    ),
    "invalid_cursor": (
        lambda: InvalidCursor("cursor is not one this server handed out"),
        400,
        b'{"error":{"type":"invalid_cursor","message":"cursor is not one this server handed out"}}',
        _length(88),
    ),
    "idempotency_conflict": (
        lambda: IdempotencyConflict("k-1", J),
        409,
        b'{"error":{"type":"idempotency_conflict","message":"idempotency_key \'k-1\' already '
        b"names job 00000000-0000-0000-0000-000000000007 with a different body; use a new key "
        b'for a new job"}}',
        _length(181),
    ),
    "unstorable_value": (
        lambda: UnstorableValue("tasks.0.instruction", "NUL characters (\\u0000) cannot be stored"),
        422,
        b'{"error":{"type":"validation_error","message":"tasks.0.instruction: NUL characters '
        b'(\\\\u0000) cannot be stored","details":[{"path":"tasks.0.instruction","message":"NUL '
        b'characters (\\\\u0000) cannot be stored"}]}}',
        _length(209),
    ),
    "unstorable_value_at_the_root": (
        lambda: UnstorableValue("", "NaN and infinite numbers cannot be stored"),
        422,
        b'{"error":{"type":"validation_error","message":"NaN and infinite numbers cannot be '
        b'stored","details":[{"path":"","message":"NaN and infinite numbers cannot be '
        b'stored"}]}}',
        _length(169),
    ),
    "quota_never": (
        lambda: QuotaExceeded(422, "max_rollouts_per_request", "asks for 9"),
        422,
        b'{"error":{"type":"quota_exceeded","message":"asks for 9"}}',
        _length(58),
    ),
    "quota_now": (
        lambda: QuotaExceeded(429, "max_rollouts_in_flight", "retry when some finish"),
        429,
        b'{"error":{"type":"quota_exceeded","message":"retry when some finish"}}',
        [("retry-after", "30"), *_length(70)],
    ),
    "floor_violation": (
        lambda: FloorViolation("POLAR_MQ_TENANT_RUNTIMES", "runtime 'local' is below the floor"),
        422,
        b'{"error":{"type":"isolation_floor","message":"runtime \'local\' is below the floor",'
        b'"details":[{"setting":"POLAR_MQ_TENANT_RUNTIMES","message":"runtime \'local\' is below '
        b'the floor"}]}}',
        _length(181),
    ),
    "unknown_delivery": (
        lambda: UnknownDelivery(f"job {J} never handed out delivery d:1"),
        404,
        b'{"error":{"type":"unknown_delivery","message":"job 00000000-0000-0000-0000-000000000007 '
        b'never handed out delivery d:1"}}',
        _length(120),
    ),
    "delivery_conflict": (
        lambda: DeliveryConflict("already_acked", "already acknowledged: d:1"),
        409,
        b'{"error":{"type":"already_acked","message":"already acknowledged: d:1"}}',
        _length(72),
    ),
    "version_went_back": (
        lambda: VersionWentBack("policy version 3 is below the current 4"),
        409,
        b'{"error":{"type":"policy_version_went_back","message":"policy version 3 is below the '
        b'current 4"}}',
        _length(97),
    ),
    "adapter_changed": (
        lambda: AdapterChanged("version 4 was published with another adapter"),
        409,
        b'{"error":{"type":"policy_version_went_back","message":"version 4 was published with '
        b'another adapter"}}',
        _length(102),
    ),
    "api_error": (
        lambda: ApiError(403, "forbidden", "this API key lacks the 'jobs:read' scope"),
        403,
        b'{"error":{"type":"forbidden","message":"this API key lacks the \'jobs:read\' scope"}}',
        _length(83),
    ),
    "api_error_with_headers": (
        lambda: ApiError(401, "unauthorized", "no key", headers={"WWW-Authenticate": "Bearer"}),
        401,
        b'{"error":{"type":"unauthorized","message":"no key"}}',
        [("www-authenticate", "Bearer"), *_length(52)],
    ),
    "data_error": (
        lambda: DataError("INSERT", {}, Exception("out of range")),
        422,
        b'{"error":{"type":"validation_error","message":"a value in the request cannot be '
        b'stored"}}',
        _length(89),
    ),
    "database_down": (
        lambda: OperationalError("SELECT 1", {}, Exception("connection refused")),
        503,
        b'{"error":{"type":"unavailable","message":"database unavailable"}}',
        [("retry-after", "5"), *_length(65)],
    ),
}


@pytest.fixture(scope="module")
def raising_client() -> Iterator[TestClient]:
    """An app with the API's error handlers and one route that raises the named error."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raise/{name}")
    def _raise(name: str) -> None:
        raise ANSWERS[name][0]()

    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("name", list(ANSWERS))
def test_each_error_is_answered_as_before(raising_client: TestClient, name: str) -> None:
    _, status, body, headers = ANSWERS[name]
    response = raising_client.get(f"/raise/{name}")
    assert (response.status_code, response.content) == (status, body)
    assert response.headers.multi_items() == headers


def _subclasses(kind: type[Exception]) -> Iterator[type[Exception]]:
    for sub in kind.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _handler_kind(handlers: dict[object, object], error: type[Exception]) -> object:
    """The class whose handler Starlette picks for `error`: the first of its MRO registered."""
    return next(kind for kind in error.__mro__ if kind in handlers)


def test_one_handler_answers_every_domain_error() -> None:
    """The served app (API and dashboard) registers `PolarError` alone of the domain errors, and
    every domain error the app can raise (all are imported by then) resolves to that handler and
    has a recorded answer above."""
    app = create_app(Settings(), session_factory=sessionmaker(), publisher=lambda _: None)
    handlers: dict[object, object] = dict(app.exception_handlers)
    domain = sorted(_subclasses(PolarError), key=lambda kind: kind.__qualname__)
    assert not [kind for kind in domain if kind in handlers], "a domain error has its own handler"
    assert PolarError in handlers
    assert {kind: _handler_kind(handlers, kind) for kind in domain} == dict.fromkeys(
        domain, PolarError
    )
    recorded = {type(make()) for make, *_ in ANSWERS.values()}
    assert [kind.__qualname__ for kind in domain if kind not in recorded] == []


def test_a_domain_error_outside_a_request_is_its_message() -> None:
    """The CLI and the workers print these: `str()` is the message alone, as before."""
    assert str(NotFound("rollout", J)) == f"rollout {J} not found"
    assert str(UnstorableValue("a.b", "too big")) == "a.b: too big"
    assert isinstance(NotFound("job", J), LookupError)
    assert isinstance(UnstorableValue("", "x"), ValueError)
