"""JSON as every engine stores it: lossless for the NUL character PostgreSQL refuses.

PostgreSQL's `jsonb` (and `text`) cannot hold U+0000, yet an agent's prompt, a binary tool output
or an engine's answer may contain it; replacing it (U+FFFD) or refusing the row loses what the
agent sent. So the JSON text is escaped on write and unescaped on read, in the engine's JSON
serializer and deserializer (`polar_mq.infra.db.create_db_engine` installs both): every JSON column
of every table, every read path (ORM rows, Core selects, `jsonb_*` functions returning JSON) and the
proxy's raw batch INSERT (`proxy.store.call_insert`) share this one scheme.

The scheme works on the serialized text, inside strings only, with the noncharacter U+FFFF as the
escape (valid UTF-8 PostgreSQL stores, never assigned, so in practice absent from real data):

    U+0000 -> U+FFFF "0"        U+FFFF -> U+FFFF U+FFFF

It is a prefix code, so decoding left to right is exact for any string, and it keeps the JSON's
shape: `request->'messages'` still works in SQL, only a string holding U+0000 or U+FFFF reads
differently there. Text without either character (nearly all of it) is stored and read as is;
the checks for it are byte searches. A row written before this scheme that happens to hold
U+FFFF followed by "0" or U+FFFF would read back changed: no such data is expected.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import orjson

ESC = "\uffff"
ESC_BYTES = ESC.encode()
NUL_ESCAPED = b"\\u0000"
"""How a JSON serializer writes U+0000 inside a string."""
NUL_STORED = ESC_BYTES + b"0"
_STORED = re.compile(re.escape(ESC_BYTES) + rb"(" + re.escape(ESC_BYTES) + rb"|0)")
_STORED_TEXT = re.compile(ESC + "(" + ESC + "|0)")


def escape_json(raw: bytes) -> bytes:
    """JSON text (non-ASCII written raw, as orjson does) -> text PostgreSQL accepts."""
    if NUL_ESCAPED not in raw and ESC_BYTES not in raw:
        return raw
    raw = raw.replace(ESC_BYTES, ESC_BYTES + ESC_BYTES)
    pieces = raw.split(NUL_ESCAPED)
    out = [pieces[0]]
    for before, after in itertools.pairwise(pieces):
        # `\u0000` is U+0000 unless it follows an odd run of backslashes (then the text is an
        # escaped backslash and "u0000"); the run never reaches into an earlier `\u0000`.
        run = len(before) - len(before.rstrip(b"\\"))
        out.append(NUL_STORED if run % 2 == 0 else NUL_ESCAPED)
        out.append(after)
    return b"".join(out)


def unescape_json(raw: bytes) -> bytes:
    """The inverse of `escape_json`."""
    if ESC_BYTES not in raw:
        return raw
    return _STORED.sub(_unescape_one, raw)


def _unescape_one(match: re.Match[bytes]) -> bytes:
    return ESC_BYTES if match.group(1) == ESC_BYTES else NUL_ESCAPED


def escape_text(text: str) -> str:
    """The same scheme on a plain string (for tests and tools that build stored text)."""
    if "\x00" not in text and ESC not in text:
        return text
    return text.replace(ESC, ESC + ESC).replace("\x00", ESC + "0")


def unescape_text(text: str) -> str:
    """The inverse of `escape_text`."""
    if ESC not in text:
        return text
    return _STORED_TEXT.sub(lambda m: ESC if m.group(1) == ESC else "\x00", text)


def dumps_bytes(value: Any) -> bytes:
    """`value` as stored JSON text (escaped), UTF-8."""
    try:
        raw = orjson.dumps(value)
    except TypeError:  # non-str keys (slower option, so only when needed), or a huge integer
        try:
            raw = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:  # e.g. an integer past 64 bits: the standard library writes it
            raw = json.dumps(value, ensure_ascii=False).encode()
    return escape_json(raw)


def dumps(value: Any) -> str:
    """The engines' `json_serializer`."""
    return dumps_bytes(value).decode()


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """The engines' `json_deserializer` (psycopg hands bytes, SQLite a str)."""
    data = raw.encode() if isinstance(raw, str) else bytes(raw)  # bytes(bytes) is no copy
    data = unescape_json(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # e.g. an integer past 64 bits
        return json.loads(data)
