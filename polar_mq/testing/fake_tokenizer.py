"""A deterministic byte-level tokenizer and a ChatML chat template for the fake vLLM engine.

Every UTF-8 byte is one token (`id = byte + 3`); ids 0-2 are the special tokens of SmolLM2
(`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`), so id 2 ends a turn exactly like the real model.
Because a byte tokenizer is injective and the template renders an assistant turn as the very text
(and tool-call markup) the fake generated, consecutive chat turns keep the prefix property the
trajectory builders rely on: previous `prompt_token_ids + token_ids` is a prefix of the next
`prompt_token_ids` when the history is appended unchanged.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ENDOFTEXT, IM_START, IM_END = 0, 1, 2
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BYTE_OFFSET = 3
VOCAB_SIZE = 256 + BYTE_OFFSET
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

_SPECIAL_RE = re.compile("|".join(re.escape(s) for s in SPECIAL_TOKENS))
_SPECIAL_IDS = {s: i for i, s in enumerate(SPECIAL_TOKENS)}


def encode(text: str) -> list[int]:
    """Token ids of `text`; special-token strings (as rendered by the template) become their id."""
    ids: list[int] = []
    pos = 0
    for match in _SPECIAL_RE.finditer(text):
        ids.extend(b + BYTE_OFFSET for b in text[pos : match.start()].encode())
        ids.append(_SPECIAL_IDS[match.group()])
        pos = match.end()
    ids.extend(b + BYTE_OFFSET for b in text[pos:].encode())
    return ids


def token_bytes(token_id: int) -> bytes:
    """The raw bytes one token stands for (what vLLM reports in `bytes`)."""
    if token_id < BYTE_OFFSET:
        return SPECIAL_TOKENS[token_id].encode()
    return bytes((token_id - BYTE_OFFSET,))


def token_str(token_id: int) -> str:
    """Display string of one token; a lone non-ASCII byte is shown vLLM-style as `bytes:\\xNN`."""
    if token_id < BYTE_OFFSET:
        return SPECIAL_TOKENS[token_id]
    byte = token_id - BYTE_OFFSET
    return chr(byte) if byte < 0x80 else f"bytes:\\x{byte:02x}"


def decode(ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    parts: list[bytes] = []
    for token_id in ids:
        if token_id >= BYTE_OFFSET:
            parts.append(bytes((token_id - BYTE_OFFSET,)))
        elif not skip_special_tokens:
            parts.append(SPECIAL_TOKENS[token_id].encode())
    return b"".join(parts).decode("utf-8", errors="replace")


class StreamDecoder:
    """Incremental detokenizer: a multi-byte character is emitted once all its bytes arrived."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, token_id: int) -> str:
        """Text added by this token (empty for special tokens and incomplete characters)."""
        if token_id < BYTE_OFFSET:
            return ""
        return self._utf8.decode(bytes((token_id - BYTE_OFFSET,)))


def content_text(content: Any) -> str:
    """Text of an OpenAI message `content`: a string, None, or a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return str(content)


def tool_call_markup(name: str, arguments: str) -> str:
    """How the fake model writes one tool call (Hermes style); the template renders it back."""
    try:
        args: Any = json.loads(arguments) if arguments else {}
    except ValueError:
        args = arguments
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _assistant_text(message: Mapping[str, Any]) -> str:
    text = content_text(message.get("content"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        text += tool_call_markup(str(function.get("name", "")), function.get("arguments") or "")
    return text


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
    *,
    strip_thinking: bool = False,
    continue_final_message: bool = False,
) -> str:
    """ChatML as SmolLM2's template renders it, plus a `<tools>` block when tools are offered.

    `strip_thinking`: a reasoning model's template (Qwen3-style) that drops the `<think>` block of
    every assistant turn in the history. `continue_final_message`: a final assistant turn is left
    open (no `<|im_end|>`), as vLLM's flag of that name renders it."""
    out: list[str] = []
    if not messages or messages[0].get("role") != "system":
        out.append(_system_block(DEFAULT_SYSTEM, tools))
    for index, message in enumerate(messages):
        role = str(message.get("role", "user"))
        if index == 0 and role == "system":
            out.append(_system_block(content_text(message.get("content")), tools))
        elif role == "assistant":
            text = _assistant_text(message)
            if strip_thinking:
                text = _THINK_RE.sub("", text)
            out.append(f"<|im_start|>assistant\n{text}<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{role}\n{content_text(message.get('content'))}<|im_end|>\n")
    if continue_final_message and messages and messages[-1].get("role") == "assistant":
        out[-1] = out[-1].removesuffix("<|im_end|>\n")
    elif add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


_THINK_RE = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_TURN_RE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n", re.DOTALL)
_TOOLS_RE = re.compile(r"\n\n<tools>\n(.*)\n</tools>$", re.DOTALL)
GENERATION_PROMPT = "<|im_start|>assistant\n"


def parse_chat(text: str) -> tuple[list[dict[str, Any]], list[Any] | None] | None:
    """The messages and tools of a rendered conversation that asks for the assistant's turn
    (`render_chat`'s output), or None for any other text: how the fake reads a token prompt."""
    if not text.endswith(GENERATION_PROMPT):
        return None
    body = text[: -len(GENERATION_PROMPT)]
    messages: list[dict[str, Any]] = []
    tools: list[Any] | None = None
    pos = 0
    for match in _TURN_RE.finditer(body):
        if match.start() != pos:
            return None
        pos = match.end()
        role, content = match.group(1), match.group(2)
        if role == "system" and not messages:
            found = _TOOLS_RE.search(content)
            if found is not None:
                tools = [json.loads(line) for line in found.group(1).splitlines()]
                content = content[: found.start()]
        messages.append({"role": role, "content": content})
    return (messages, tools) if pos == len(body) and messages else None


def _system_block(text: str, tools: Sequence[Any] | None) -> str:
    if tools:
        text += "\n\n<tools>\n" + "\n".join(json.dumps(t) for t in tools) + "\n</tools>"
    return f"<|im_start|>system\n{text}<|im_end|>\n"
