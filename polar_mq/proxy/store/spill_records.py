"""The spill buffer's record format: `<u32 length><u32 crc32><u32 rows><orjson list of rows>`.

The row count in the header lets a restarted proxy size its backlog without parsing a payload;
the checksum (over the row count and the payload) and the length find a torn or corrupt record.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

HEADER = struct.Struct("<III")
"""Payload length, CRC32 (of the row count and the payload), row count."""
END = bytes(HEADER.size)
"""An all-zero header ends a file's records (no record has an empty payload): the answer
journal writes it after its last record, before the older contents of its recycled file."""
_RESTORE: dict[str, Any] = {
    "id": uuid.UUID,
    "rollout_id": uuid.UUID,
    "created_at": datetime.fromisoformat,
}
"""Row fields orjson writes as strings and the inserters need back as Python objects."""


def _crc(count: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(count.to_bytes(4, "little")))


def encode_rows(rows: list[dict[str, Any]]) -> bytes:
    """One record: header (length, CRC32, row count) and the orjson of the rows."""
    payload = orjson.dumps(rows)
    return HEADER.pack(len(payload), _crc(len(rows), payload), len(rows)) + payload


def decode_rows(payload: bytes) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = orjson.loads(payload)
    for row in rows:
        for name, restore in _RESTORE.items():
            value = row.get(name)
            if isinstance(value, str):
                row[name] = restore(value)
    return rows


def read_segment(path: Path) -> tuple[list[dict[str, Any]], int, bool]:
    """(rows of every intact record, intact records, whether a torn/corrupt record was found)."""
    rows: list[dict[str, Any]] = []
    records = 0
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        if offset + HEADER.size > len(data):
            return rows, records, True
        length, crc, count = HEADER.unpack_from(data, offset)
        if length == crc == count == 0:  # the end mark
            return rows, records, False
        start = offset + HEADER.size
        payload = data[start : start + length]
        if len(payload) != length or _crc(count, payload) != crc:
            return rows, records, True
        try:
            rows.extend(decode_rows(payload))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            return rows, records, True
        records += 1
        offset = start + length
    return rows, records, False


def count_rows(path: Path) -> int:
    """Rows in a segment, from the record headers alone (fast at start; replay verifies)."""
    rows = 0
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        offset = 0
        while offset + HEADER.size <= size:
            handle.seek(offset)
            length, crc, count = HEADER.unpack(handle.read(HEADER.size))
            if length == crc == count == 0:  # the end mark
                break
            offset += HEADER.size + length
            if offset > size:
                break
            rows += count
    return rows
