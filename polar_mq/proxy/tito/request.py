"""A chat request as the completions request of a token prompt, or why it cannot be one.

Sampling parameters carry over as they are (vLLM's completions take the same ones). Options that
only the chat path honours (structured output, a forced tool, several choices, template
arguments, continuing the final message) send the call the chat way instead.
"""

from __future__ import annotations

from typing import Any

UNSUPPORTED_OPTION = "unsupported_option"

CARRIED = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "logit_bias",
    "stream",
    "stream_options",
    "user",
    "priority",
    "request_id",
    "cache_salt",
)
"""Chat fields a completions request takes unchanged."""

CHAT_ONLY = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "chat_template",
    "chat_template_kwargs",
    "continue_final_message",
    "echo",
    "documents",
    "mm_processor_kwargs",
    "prompt_logprobs",
)


def unsupported(body: dict[str, Any]) -> str | None:
    """Why `body` must go the chat way (an option name), or None."""
    for name in CHAT_ONLY:
        if body.get(name) is not None:
            return name
    if body.get("add_generation_prompt") is False:
        return "add_generation_prompt"
    n = body.get("n")
    if n is not None and n != 1:
        return "n"
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        return "tool_choice"
    return None


def completions_body(chat: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    """The `/v1/completions` body for the engine (ids and logprobs asked, as the chat path does).

    `max_tokens: null` leaves the engine's default (the context's room, as for chat) rather than
    completions' own default of 16."""
    out: dict[str, Any] = {name: chat[name] for name in CARRIED if name in chat}
    out["prompt"] = prompt
    limit = chat.get("max_completion_tokens")
    out["max_tokens"] = chat.get("max_tokens") if limit is None else limit
    out["return_token_ids"] = True
    top = chat.get("top_logprobs")
    out["logprobs"] = top if chat.get("logprobs") and isinstance(top, int) else 0
    return out
