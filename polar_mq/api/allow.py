"""The `Allow` header of a 405: every method the path serves, not only the first route's.

Starlette answers a method it cannot route with the methods of the first route whose path matched,
so `OPTIONS /v1/jobs` said `Allow: POST` although `GET /v1/jobs` exists too (RFC 9110 §15.5.6
wants the resource's full set). The set is found by asking the app's own routes whether each
method would match, so it can never drift from the routing table.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Match

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """The methods some route of the app serves at the request's path, in a stable order."""
    routes = request.app.router.routes
    found = []
    for method in METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(dict(scope))[0] == Match.FULL for route in routes):
            found.append(method)
    return found
