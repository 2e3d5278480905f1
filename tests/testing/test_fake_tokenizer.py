"""The fake engine's byte tokenizer and ChatML template."""

from __future__ import annotations

from polar_mq.testing.fake_tokenizer import (
    IM_END,
    IM_START,
    StreamDecoder,
    decode,
    encode,
    render_chat,
    token_str,
)


def test_bytes_map_to_ids_and_back() -> None:
    text = "17 + 25 = 42, déjà vu ✓"
    ids = encode(text)
    assert ids[:2] == [ord("1") + 3, ord("7") + 3]
    assert len(ids) == len(text.encode())
    assert decode(ids) == text


def test_special_tokens_in_rendered_text_become_single_ids() -> None:
    assert encode("<|im_start|>user\nhi<|im_end|>") == [IM_START, *encode("user\nhi"), IM_END]
    assert decode([IM_START, *encode("x"), IM_END]) == "x"
    assert decode([IM_START, *encode("x"), IM_END], skip_special_tokens=False) == (
        "<|im_start|>x<|im_end|>"
    )


def test_stream_decoder_waits_for_whole_characters() -> None:
    decoder = StreamDecoder()
    pieces = [decoder.step(t) for t in encode("é!")]
    assert pieces == ["", "é", "!"]
    assert decoder.step(IM_END) == ""


def test_token_strings() -> None:
    assert token_str(IM_END) == "<|im_end|>"
    assert token_str(encode("a")[0]) == "a"
    assert token_str(encode("é")[0]) == "bytes:\\xc3"


def test_template_renders_chatml_with_default_system_prompt() -> None:
    text = render_chat([{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert "user\nab<|im_end|>" in render_chat([{"role": "user", "content": parts}])


def test_tools_are_part_of_the_prompt() -> None:
    tool = {"type": "function", "function": {"name": "calculator"}}
    plain = render_chat([{"role": "system", "content": "S"}, {"role": "user", "content": "q"}])
    with_tools = render_chat(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}], [tool]
    )
    assert plain != with_tools and '"calculator"' in with_tools
