"""`choose_model`: a job's model against the engine's listing (the API's submit-time check)."""

from __future__ import annotations

import pytest

from polar_mq.infra.ports import free_port
from polar_mq.jobs.served_models import ModelChoice, ServedModels, choose_model, engine_models

ONE = ServedModels(("qwen",), ("qwen",))
WITH_ADAPTER = ServedModels(("qwen", "lora-a"), ("qwen",))  # vLLM lists an adapter's parent
TWO = ServedModels(("qwen", "llama"), ("qwen", "llama"))


@pytest.mark.parametrize(
    ("asked", "served", "model"),
    [
        (None, ONE, "qwen"),  # unset: the one served model, stored with the job
        ("default", ONE, "qwen"),  # the agent's alias for "what is served"
        ("lora-a", WITH_ADAPTER, "lora-a"),
        (None, WITH_ADAPTER, "qwen"),  # an adapter is never picked for a job that names none
        ("anything", None, "anything"),  # the engine could not be asked: unchecked
        (None, None, None),
    ],
)
def test_a_model_the_engine_serves_is_kept_or_filled_in(
    asked: str | None, served: ServedModels | None, model: str | None
) -> None:
    assert choose_model(asked, served) == ModelChoice(model)


def test_a_model_the_engine_does_not_serve_is_refused_naming_what_it_serves() -> None:
    choice = choose_model("qwen-typo", ONE)
    assert choice.problem is not None
    assert choice.problem.startswith(
        "model 'qwen-typo' is not served by the engine, which serves 'qwen'; leave the job's "
        "model unset"
    )


def test_no_model_on_an_engine_serving_several_is_refused() -> None:
    choice = choose_model(None, TWO)
    assert choice.problem == (
        "the engine serves several models ('qwen', 'llama'): name one as the job's model"
    )


def test_an_engine_that_cannot_be_asked_is_unknown_not_an_error() -> None:
    assert engine_models(f"http://127.0.0.1:{free_port()}", timeout_s=1.0) is None
