"""Opaque keyset cursors for paged reads (base64 of a JSON list, checked on the way back)."""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from polar_mq.jobs.read_models import InvalidCursor

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def encode_cursor(values: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(values))).decode().rstrip("=")


def decode_cursor(cursor: str, kinds: Sequence[type]) -> list[Any]:
    """The values of a cursor made by `encode_cursor`, checked against the expected kinds."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        values = orjson.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise InvalidCursor("cursor is not one this server handed out") from exc
    if not isinstance(values, list) or len(values) != len(kinds):
        raise InvalidCursor("cursor is not one this server handed out")
    out: list[Any] = []
    for value, kind in zip(values, kinds, strict=True):
        try:
            if kind is datetime and isinstance(value, str):
                out.append(datetime.fromisoformat(value))
            elif kind is uuid.UUID and isinstance(value, str):
                out.append(uuid.UUID(value))
            elif kind is int and isinstance(value, int) and not isinstance(value, bool):
                if not INT64_MIN <= value <= INT64_MAX:  # the database would refuse it
                    raise ValueError(value)
                out.append(value)
            else:  # forged: a value of another type (an int where an id was, say)
                raise TypeError(value)
        except (TypeError, ValueError) as exc:
            raise InvalidCursor("cursor is not one this server handed out") from exc
    return out
