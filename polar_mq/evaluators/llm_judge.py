"""`llm_judge`: a judge model scores the agent's answer, called through the proxy.

The call goes to the proxy's OpenAI-compatible endpoint with a token minted for the rollout with
purpose "judge" (`EvalContext.llm`, set by the evaluate stage), so it uses the same backends, is
logged with the rollout's calls for audit, and is marked so the build stage never trains on it.

Spec: `{"name": "llm_judge", "prompt": "Question: {instruction}\\nAnswer: {answer}\\n
Reference: {reference}\\nScore 0-10 as 'Score: N'.", "system": ..., "min_score": 0,
"max_score": 10, "reference_key": "answer", "sampling": {"temperature": 0}, "timeout": 60,
"retries": 3}`. The prompt is a `str.format` template over `instruction`, `answer` (the agent's
final text), `reference` (`task[reference_key]`) and the task's own fields. Transient failures
(connection errors, timeouts, 429/5xx) are retried with backoff; what still fails, or a reply with
no readable score, gives reward None with the reason, never a silent 0.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from polar_mq.evaluators.base import EvalContext, EvalResult, Evaluator, LlmEndpoint
from polar_mq.evaluators.judge_score import normalise, parse_score

BUILTIN_FIELDS = ("instruction", "answer", "reference")
RESERVED_SAMPLING = frozenset({"model", "messages", "stream", "n", "prompt"})
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": 512}
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
REPLY_CHARS = 4000
"""How much of the judge's reply the evaluation detail keeps (the full call is in llm_calls)."""


class TransientJudgeError(Exception):
    """A failure worth retrying (the backend is busy, paused or briefly unreachable)."""


class JudgeCallError(Exception):
    """A failure retrying will not fix (a 4xx, a reply without text)."""


def _template_fields(template: str) -> list[str]:
    """The field names a template uses; only plain names, so a spec cannot reach attributes."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"llm_judge: bad prompt template: {exc}") from exc
    for _, name, spec, _ in parsed:
        for field in (name, *(part for _, part, _, _ in string.Formatter().parse(spec or ""))):
            if field is None:
                continue
            if not field.isidentifier():
                raise ValueError(
                    f"llm_judge: template field {{{field}}} must be a plain name "
                    "(no positional fields, attributes or indexing)"
                )
            names.append(field)
    return names


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"llm_judge: {what!r} must be a positive number")
    return float(value)


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"llm_judge: {what!r} must be a finite number")
    return float(value)


class LlmJudgeEvaluator(Evaluator):
    """Scores the final text with a judge model; reward = (score - min) / (max - min)."""

    name = "llm_judge"
    needs_llm = True

    def __init__(
        self,
        prompt: str,
        system: str | None = None,
        min_score: float = 0.0,
        max_score: float = 10.0,
        reference_key: str = "answer",
        score_pattern: str | None = None,
        model: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        retry_wait_s: float = 0.5,
    ) -> None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("llm_judge: 'prompt' must be a non-empty template string")
        if system is not None and not isinstance(system, str):
            raise ValueError("llm_judge: 'system' must be a string")
        self.fields = _template_fields(prompt)
        self.low = _finite(min_score, "min_score")
        self.high = _finite(max_score, "max_score")
        if self.high <= self.low:
            raise ValueError("llm_judge: 'max_score' must be greater than 'min_score'")
        if not isinstance(reference_key, str) or not reference_key:
            raise ValueError("llm_judge: 'reference_key' must be a non-empty string")
        self.pattern = _compile_pattern(score_pattern)
        if model is not None and (not isinstance(model, str) or not model):
            raise ValueError("llm_judge: 'model' must be a non-empty string")
        if sampling is not None and not isinstance(sampling, Mapping):
            raise ValueError("llm_judge: 'sampling' must be a mapping of request fields")
        reserved = RESERVED_SAMPLING & set(sampling or {})
        if reserved:
            raise ValueError(f"llm_judge: 'sampling' may not set {sorted(reserved)}")
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
            raise ValueError("llm_judge: 'retries' must be an integer from 0 to 10")
        self.prompt, self.system = prompt, system
        self.reference_key, self.model = reference_key, model
        self.sampling = {**DEFAULT_SAMPLING, **dict(sampling or {})}
        self.timeout = _positive(timeout, "timeout")
        self.retries = retries
        self.retry_wait_s = _positive(retry_wait_s, "retry_wait_s")

    def required_task_fields(self) -> frozenset[str]:
        """The task fields the prompt names (`{reference}` reads `reference_key`); `instruction`
        and `answer` are always there."""
        given = {"instruction", "answer"}
        return frozenset(
            self.reference_key if name == "reference" else name
            for name in self.fields
            if name not in given
        )

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        if ctx.llm is None:
            return EvalResult(None, {"error": "no judge endpoint (run in the evaluate stage)"})
        if ctx.final_text is None:
            return EvalResult(0.0, {"answer": None, "message": "no answer to judge"})
        rendered = self._render(ctx)
        if isinstance(rendered, EvalResult):
            return rendered
        model = self.model or ctx.llm.model
        detail: dict[str, Any] = {"judge_model": model, "scale": [self.low, self.high]}
        try:
            reply, attempts = self._call(ctx.llm, model, rendered)
        except (TransientJudgeError, JudgeCallError, httpx.HTTPError) as exc:
            message = str(exc) or type(exc).__name__
            return EvalResult(None, {**detail, "error": "judge call failed", "message": message})
        detail.update(attempts=attempts, reply=reply[:REPLY_CHARS])
        score = parse_score(reply, self.pattern)
        if score is None:
            return EvalResult(None, {**detail, "error": "unparseable judge reply"})
        reward, problem = normalise(score, self.low, self.high)
        detail.update(score=score.value, score_form=score.form)
        if problem is not None:
            detail.update(error="score out of scale", message=problem)
        return EvalResult(reward, detail)

    def _render(self, ctx: EvalContext) -> str | EvalResult:
        values: dict[str, Any] = {k: v for k, v in ctx.task.items() if isinstance(k, str)}
        values["instruction"] = ctx.task.get("instruction", "")
        values["answer"] = ctx.final_text
        if self.reference_key in ctx.task:
            values["reference"] = ctx.task[self.reference_key]
        missing = sorted({name for name in self.fields if name not in values})
        if missing:
            reason = f"prompt template fields missing from the task: {', '.join(missing)}"
            return EvalResult(None, {"error": "bad judge prompt", "message": reason})
        try:
            return self.prompt.format_map(values)
        except (ValueError, TypeError) as exc:  # a format spec that does not fit the value
            return EvalResult(None, {"error": "bad judge prompt", "message": str(exc)})

    def _call(self, llm: LlmEndpoint, model: str, prompt: str) -> tuple[str, int]:
        """The judge's reply text and the number of attempts it took."""
        messages = [{"role": "user", "content": prompt}]
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        body = {**self.sampling, "model": model, "messages": messages, "stream": False}
        retrying = Retrying(
            retry=retry_if_exception_type((TransientJudgeError, httpx.TransportError)),
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=self.retry_wait_s, max=30.0),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                reply = _post(llm, body, self.timeout)
        return reply, retrying.statistics.get("attempt_number", 1)


def _post(llm: LlmEndpoint, body: dict[str, Any], timeout: float) -> str:
    response = llm.http.post(
        f"{llm.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {llm.api_key}"},
        timeout=timeout,
    )
    if response.status_code in TRANSIENT_STATUS:
        raise TransientJudgeError(f"judge backend answered HTTP {response.status_code}")
    if response.status_code != 200:
        raise JudgeCallError(f"HTTP {response.status_code}: {response.text[:500]}")
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise JudgeCallError(f"judge reply is not a chat completion: {exc!r}") from exc
    if not isinstance(content, str):
        raise JudgeCallError("judge reply has no text content")
    return content


def _compile_pattern(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("llm_judge: 'score_pattern' must be a non-empty regex string")
    try:
        compiled = re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"llm_judge: invalid 'score_pattern': {exc}") from exc
    if compiled.groups < 1:
        raise ValueError("llm_judge: 'score_pattern' needs a capture group around the number")
    return compiled
