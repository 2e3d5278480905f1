"""Errors every layer may raise about the domain's objects, below all the packages that do."""

from __future__ import annotations


class NotFound(LookupError):
    """The job or rollout does not exist (the API answers 404)."""

    def __init__(self, kind: str, ident: object) -> None:
        super().__init__(f"{kind} {ident} not found")
        self.kind = kind
