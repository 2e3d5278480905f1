"""`llm_judge` in isolation: score parsing, the request it sends, retries, and every way to fail.

The judge's HTTP endpoint is an `httpx.MockTransport` here (the network, not our code); the judge
through the real proxy and the fake vLLM is in test_llm_judge_proxy.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polar_mq.evaluators import EvalContext, LlmEndpoint, LlmJudgeEvaluator, get_evaluator
from polar_mq.evaluators.judge_score import Score, normalise, parse_score

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.mark.parametrize(
    ("text", "value", "out_of", "form"),
    [
        ('{"score": 7}', 7, None, "json"),
        (
            'The answer is right.\n```json\n{"reasoning": "ok", "Score": "8.5"}\n```',
            8.5,
            None,
            "json",
        ),
        ('{"rating": 3} then {"score": 9}', 9, None, "json"),
        ("Rating: [[8]]", 8, None, "brackets"),
        ("[[6/10]]", 6, 10, "brackets"),
        ("Score: 7/10", 7, 10, "labelled"),
        ("The answer is correct but terse.\nScore: 7", 7, None, "labelled"),
        ("**Score:** 9", 9, None, "labelled"),
        ("**Rating**: 4 out of 5", 4, 5, "labelled"),
        ("Grade = 2.5", 2.5, None, "labelled"),
        ("Score: 3\n...on reflection...\nFinal score: 6", 6, None, "labelled"),
        ("7", 7, None, "bare"),
        (" 7.5. ", 7.5, None, "bare"),
        ("**8**", 8, None, "bare"),
        ("9/10", 9, 10, "bare"),
        ("<think>Score: 2 seems harsh</think>Score: 8", 8, None, "labelled"),
    ],
)
def test_parse_score_forms(text: str, value: float, out_of: float | None, form: str) -> None:
    assert parse_score(text) == Score(value, out_of, form)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I would give this answer a seven.",
        "The answer 42 is correct and 3 steps were shown.",  # stray numbers are not a verdict
        '{"score": "high"}',
        '{"score": true}',
        "Score: N/A",
        "<think>Score: 9</think>",  # only the scratchpad had a score
        "[[nan]]",
    ],
)
def test_unparseable_replies(text: str) -> None:
    assert parse_score(text) is None


def test_custom_pattern_replaces_the_built_in_forms() -> None:
    evaluator = LlmJudgeEvaluator(prompt="{answer}", score_pattern=r"VERDICT\s+(\d+)")
    assert evaluator.pattern is not None
    assert parse_score("Score: 2. VERDICT 9", evaluator.pattern) == Score(9, None, "pattern")
    assert parse_score("Score: 2", evaluator.pattern) is None


@pytest.mark.parametrize(
    ("score", "low", "high", "reward"),
    [
        (Score(7, 10, "labelled"), 0, 10, 0.7),
        (Score(1, None, "bare"), 1, 10, 0.0),
        (Score(10, None, "bare"), 1, 10, 1.0),
        (Score(3, None, "bare"), 1, 5, 0.5),
    ],
)
def test_normalise(score: Score, low: float, high: float, reward: float) -> None:
    assert normalise(score, low, high) == (pytest.approx(reward), None)


@pytest.mark.parametrize(
    ("score", "problem"),
    [
        (Score(11, None, "bare"), "score 11 is outside the scale 0..10"),
        (Score(-1, None, "bare"), "score -1 is outside the scale 0..10"),
        (Score(4, 5, "labelled"), "judge scored out of 5, the scale is 0..10"),
    ],
)
def test_normalise_refuses_what_does_not_fit(score: Score, problem: str) -> None:
    assert normalise(score, 0, 10) == (None, problem)


SCALES = st.tuples(st.integers(-5, 5), st.integers(1, 100)).map(lambda t: (t[0], t[0] + t[1]))
FORMS = [
    "Score: {v}",
    "Score: {v}/{hi}",
    "[[{v}]]",
    '{{"score": {v}}}',
    "{v}",
    "The answer is fine.\n\nRating: **{v}**",
]


@given(scale=SCALES, fraction=st.fractions(0, 1, max_denominator=8), form=st.sampled_from(FORMS))
def test_every_form_normalises_to_the_same_reward(scale: Any, fraction: Any, form: str) -> None:
    low, high = scale
    value = low + (high - low) * fraction
    text = form.format(v=f"{float(value):g}", hi=high)
    score = parse_score(text)
    assert score is not None, text
    reward, problem = normalise(score, low, high)
    assert problem is None
    assert reward == pytest.approx(float(fraction), abs=1e-5)


@given(st.text(alphabet=st.characters(exclude_categories=["Nd"]), max_size=200))
def test_text_without_digits_never_scores(text: str) -> None:
    assert parse_score(text) is None


# --- the evaluator against a scripted endpoint ---------------------------------------------


def chat(content: Any) -> httpx.Response:
    return httpx.Response(
        200, json={"choices": [{"message": {"role": "assistant", "content": content}}]}
    )


class Endpoint:
    """Answers judge requests from a script and keeps the requests it got."""

    def __init__(self, *script: httpx.Response | Exception) -> None:
        self.script = list(script)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def bodies(self) -> list[dict[str, Any]]:
        return [orjson.loads(r.content) for r in self.requests]


@pytest.fixture
def http() -> Iterator[Callable[[Endpoint], LlmEndpoint]]:
    clients: list[httpx.Client] = []

    def make(endpoint: Endpoint) -> LlmEndpoint:
        client = httpx.Client(transport=httpx.MockTransport(endpoint))
        clients.append(client)
        return LlmEndpoint("http://proxy.test/v1", "pmq_judge_token", "policy-model", client)

    yield make
    for client in clients:
        client.close()


def ctx_with(
    llm: LlmEndpoint | None, final_text: str | None = "ANSWER: 42", **task: Any
) -> EvalContext:
    return EvalContext(
        rollout_id="r-1",
        task={"instruction": "What is 6*7?", "answer": "42", **task},
        runtime=None,
        workdir=None,
        agent_exit_code=0,
        termination_reason="completed",
        final_text=final_text,
        llm=llm,
    )


PROMPT = "Q: {instruction}\nA: {answer}\nReference: {reference}\nTopic: {topic}"


def judge(**params: Any) -> LlmJudgeEvaluator:
    evaluator = get_evaluator(
        {"name": "llm_judge", "prompt": PROMPT, "retry_wait_s": 0.001, **params}
    )
    assert isinstance(evaluator, LlmJudgeEvaluator)
    return evaluator


def test_request_shape_and_reward(http: Callable[[Endpoint], LlmEndpoint]) -> None:
    endpoint = Endpoint(chat("Correct.\nScore: 8/10"))
    evaluator = judge(system="You are a strict grader.", sampling={"max_tokens": 64, "seed": 1})
    result = evaluator.evaluate(ctx_with(http(endpoint), topic="arithmetic"))
    assert result.reward == pytest.approx(0.8)
    assert result.detail == {
        "judge_model": "policy-model",
        "scale": [0.0, 10.0],
        "attempts": 1,
        "reply": "Correct.\nScore: 8/10",
        "score": 8.0,
        "score_form": "labelled",
    }
    (request,) = endpoint.requests
    assert str(request.url) == "http://proxy.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer pmq_judge_token"
    assert endpoint.bodies() == [
        {
            "temperature": 0.0,
            "max_tokens": 64,
            "seed": 1,
            "model": "policy-model",
            "stream": False,
            "messages": [
                {"role": "system", "content": "You are a strict grader."},
                {
                    "role": "user",
                    "content": "Q: What is 6*7?\nA: ANSWER: 42\nReference: 42\nTopic: arithmetic",
                },
            ],
        }
    ]


def test_model_and_reference_key_and_scale(http: Callable[[Endpoint], LlmEndpoint]) -> None:
    endpoint = Endpoint(chat("[[4]]"))
    evaluator = judge(
        prompt="{answer} vs {reference}", model="judge-model", reference_key="gold",
        min_score=1, max_score=5,
    )  # fmt: skip
    result = evaluator.evaluate(ctx_with(http(endpoint), gold="forty-two"))
    assert result.reward == pytest.approx(0.75)
    assert endpoint.bodies()[0]["model"] == "judge-model"
    assert endpoint.bodies()[0]["messages"] == [
        {"role": "user", "content": "ANSWER: 42 vs forty-two"}
    ]


def test_transient_failures_are_retried(http: Callable[[Endpoint], LlmEndpoint]) -> None:
    endpoint = Endpoint(
        httpx.Response(503, json={"error": "paused for a weight update"}),
        httpx.ConnectError("connection refused"),
        httpx.Response(429),
        chat("Score: 10"),
    )
    result = judge(retries=3).evaluate(ctx_with(http(endpoint), topic="t"))
    assert result.reward == 1.0
    assert result.detail["attempts"] == 4
    assert len(endpoint.requests) == 4


def test_retries_run_out_into_an_unscored_result(http: Callable[[Endpoint], LlmEndpoint]) -> None:
    endpoint = Endpoint(httpx.Response(502), httpx.ReadTimeout("slow"), chat("Score: 10"))
    result = judge(retries=1).evaluate(ctx_with(http(endpoint), topic="t"))
    assert result.reward is None
    assert result.detail["error"] == "judge call failed"
    assert result.detail["message"] == "slow"
    assert len(endpoint.requests) == 2


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(400, text="prompt too long"), "HTTP 400: prompt too long"),
        (httpx.Response(401, text="invalid rollout token"), "HTTP 401: invalid rollout token"),
        (httpx.Response(200, json={"object": "list"}), "judge reply is not a chat completion"),
        (httpx.Response(200, text="<html>"), "judge reply is not a chat completion"),
        (chat(None), "judge reply has no text content"),
    ],
)
def test_permanent_failures_are_not_retried(
    http: Callable[[Endpoint], LlmEndpoint], response: httpx.Response, message: str
) -> None:
    endpoint = Endpoint(response, chat("Score: 10"))
    result = judge(retries=3).evaluate(ctx_with(http(endpoint), topic="t"))
    assert result.reward is None
    assert result.detail["error"] == "judge call failed"
    assert message in result.detail["message"]
    assert len(endpoint.requests) == 1


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("A fine answer, I'd say seven.", "unparseable judge reply"),
        ("Score: 12", "score out of scale"),
        ("Score: 4/5", "score out of scale"),
    ],
)
def test_replies_without_a_usable_score(
    http: Callable[[Endpoint], LlmEndpoint], reply: str, error: str
) -> None:
    result = judge().evaluate(ctx_with(http(Endpoint(chat(reply))), topic="t"))
    assert result.reward is None
    assert result.detail["error"] == error
    assert result.detail["reply"] == reply


def test_nothing_is_sent_when_the_prompt_cannot_be_filled(
    http: Callable[[Endpoint], LlmEndpoint],
) -> None:
    endpoint = Endpoint()
    result = judge().evaluate(ctx_with(http(endpoint)))  # the task has no "topic"
    assert result.reward is None
    assert result.detail == {
        "error": "bad judge prompt",
        "message": "prompt template fields missing from the task: topic",
    }
    no_reference = judge(reference_key="gold").evaluate(ctx_with(http(endpoint), topic="t"))
    assert no_reference.detail["message"].endswith("missing from the task: reference")
    bad_spec = judge(prompt="{answer:d}").evaluate(ctx_with(http(endpoint)))
    assert bad_spec.detail["error"] == "bad judge prompt"
    assert endpoint.requests == []


def test_no_answer_scores_zero_and_no_endpoint_is_unscored(
    http: Callable[[Endpoint], LlmEndpoint],
) -> None:
    endpoint = Endpoint()
    no_answer = judge().evaluate(ctx_with(http(endpoint), final_text=None, topic="t"))
    assert no_answer.reward == 0.0
    assert endpoint.requests == []
    outside_stage = judge().evaluate(ctx_with(None, topic="t"))
    assert outside_stage.reward is None
    assert "no judge endpoint" in outside_stage.detail["error"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "missing 1 required positional argument: 'prompt'"),
        ({"prompt": "  "}, "'prompt' must be a non-empty template string"),
        ({"prompt": "{0}"}, "must be a plain name"),
        ({"prompt": "{}"}, "must be a plain name"),
        ({"prompt": "{answer.__class__}"}, "must be a plain name"),
        ({"prompt": "{answer[0]}"}, "must be a plain name"),
        ({"prompt": "{answer:>{width.x}}"}, "must be a plain name"),
        ({"prompt": "{answer"}, "bad prompt template"),
        ({"prompt": "{answer}", "system": 3}, "'system' must be a string"),
        ({"prompt": "{answer}", "min_score": 5, "max_score": 5}, "must be greater"),
        ({"prompt": "{answer}", "max_score": "10"}, "'max_score' must be a finite number"),
        ({"prompt": "{answer}", "retries": -1}, "'retries' must be an integer from 0 to 10"),
        ({"prompt": "{answer}", "retries": 2.5}, "'retries' must be an integer"),
        ({"prompt": "{answer}", "timeout": 0}, "'timeout' must be a positive number"),
        ({"prompt": "{answer}", "sampling": {"stream": True}}, "may not set ['stream']"),
        ({"prompt": "{answer}", "sampling": [1]}, "'sampling' must be a mapping"),
        ({"prompt": "{answer}", "score_pattern": r"\d+"}, "needs a capture group"),
        ({"prompt": "{answer}", "score_pattern": "("}, "invalid 'score_pattern'"),
        ({"prompt": "{answer}", "model": ""}, "'model' must be a non-empty string"),
        ({"prompt": "{answer}", "temperature": 0}, "unexpected keyword argument 'temperature'"),
    ],
)
def test_bad_specs_are_value_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        get_evaluator({"name": "llm_judge", **params})
    assert message in str(excinfo.value)
