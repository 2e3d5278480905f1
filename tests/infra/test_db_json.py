"""The lossless JSON escaping every engine applies (`polar_mq.infra.db_json`), without a
database."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from polar_mq.infra import db_json

TRICKY = st.text(alphabet=st.sampled_from(["\x00", "\uffff", "\\", "u", "0", "a", '"', "\x01"]))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | TRICKY | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_every_value_round_trips(value: Any) -> None:
    assert db_json.loads(db_json.dumps(value)) == value
    assert db_json.loads(db_json.dumps_bytes(value)) == value


@given(JSON_VALUES)
def test_stored_text_never_holds_a_nul(value: Any) -> None:
    stored = db_json.dumps_bytes(value)
    assert b"\\u0000" not in stored.replace(b"\\\\", b"")
    json.loads(stored)  # still JSON, of the same shape
    assert type(orjson.loads(stored)) is type(value)


@given(TRICKY)
def test_text_scheme_matches_the_json_scheme(text: str) -> None:
    assert db_json.unescape_text(db_json.escape_text(text)) == text
    assert db_json.loads(db_json.dumps(text)) == text
    assert orjson.loads(db_json.dumps(text)) == db_json.escape_text(text)


def test_plain_text_is_stored_as_is() -> None:
    value = {"messages": [{"content": "caf\u00e9 \\u0000 \n"}]}
    assert db_json.dumps_bytes(value) == orjson.dumps(value)


def test_all_latin1_bytes_survive() -> None:
    binary = bytes(range(256)).decode("latin-1")
    assert db_json.loads(db_json.dumps({"tool": binary}))["tool"].encode("latin-1") == bytes(
        range(256)
    )


def test_big_integers_and_non_str_keys_still_serialize() -> None:
    assert db_json.loads(db_json.dumps({"n": 2**70})) == {"n": 2**70}
    assert db_json.loads(db_json.dumps({1: "a\x00"})) == {"1": "a\x00"}
