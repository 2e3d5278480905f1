"""Every API family's routes, in one list for the app factory (each also under `/r/{token}`)."""

from __future__ import annotations

from polar_mq.proxy.apis import anthropic, gemini, responses
from polar_mq.proxy.apis.route import Handler

FAMILIES = (anthropic, responses, gemini)


def family_routes() -> list[tuple[str, Handler, str]]:
    """(path, handler, method) of every family."""
    return [route for family in FAMILIES for route in family.routes()]
