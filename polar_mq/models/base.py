"""Declarative base and the column types shared by every table.

Token arrays (ids, masks, logprobs) are stored as packed little-endian binary instead of JSON lists:
4 bytes per token instead of ~6-8 characters, no parsing on read, and the same bytes on PostgreSQL
(BYTEA) and the embedded SQLite default (BLOB).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Integer, LargeBinary, MetaData, TypeDecorator
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BigIntId = BigInteger().with_variant(Integer(), "sqlite")
"""64-bit autoincrement key that SQLite also auto-increments (it only does so for INTEGER)."""

JsonDoc = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on both PostgreSQL and SQLite (which drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


def _pack(typecode: str, values: Sequence[int] | Sequence[float]) -> bytes:
    arr = array(typecode, values)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def _unpack(typecode: str, raw: bytes) -> array[Any]:
    arr = array(typecode)
    arr.frombytes(raw)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr


def pack_int32(values: Sequence[int]) -> bytes:
    return _pack("i", values)


def unpack_int32(raw: bytes) -> list[int]:
    return _unpack("i", raw).tolist()


def pack_float32(values: Sequence[float]) -> bytes:
    return _pack("f", values)


def unpack_float32(raw: bytes) -> list[float]:
    return _unpack("f", raw).tolist()


class PackedInt32(TypeDecorator[list[int]]):
    """A list of int32 (token ids, loss masks) stored as packed little-endian bytes."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Sequence[int] | None, dialect: Dialect) -> bytes | None:
        return None if value is None else pack_int32(value)

    def process_result_value(self, value: bytes | None, dialect: Dialect) -> list[int] | None:
        return None if value is None else unpack_int32(bytes(value))


class PackedFloat32(TypeDecorator[list[float]]):
    """A list of float32 (logprobs) stored as packed little-endian bytes."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Sequence[float] | None, dialect: Dialect) -> bytes | None:
        return None if value is None else pack_float32(value)

    def process_result_value(self, value: bytes | None, dialect: Dialect) -> list[float] | None:
        return None if value is None else unpack_float32(bytes(value))


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UtcDateTime()}  # noqa: RUF012
