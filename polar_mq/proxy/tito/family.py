"""A TITO call answered in the agent's API family: the `ApiFamily` the capture code calls.

The capture path already answers translated families (`CallContext.translated`): it renders a
non-streamed engine answer with `render` and a stream with `stream`'s translator. A TITO call is
one more translation, from the engine's completion to chat completions, and for a call that came
in through another family (`outer`: Messages, Responses, Gemini) on from chat to that family, by
the family's own `render` and stream translator, unchanged.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from polar_mq.proxy.apis.base import StreamTranslator, TranslatedCall, Translation
from polar_mq.proxy.tito.answer import Answerer, TitoStream


class TitoFamily:
    """One call's answerer; `reply()` is the assistant message the agent got (in chat's form)
    once the answer was rendered or the stream ended."""

    NAME = "chat"

    def __init__(self, answerer: Answerer, outer: TranslatedCall | None = None) -> None:
        self.answerer = answerer
        self.outer = outer
        self._reply: dict[str, Any] | None = None
        self._streamed: TitoStream | None = None

    def to_chat(self, body: dict[str, Any], request: Any) -> Translation:
        raise NotImplementedError("a TITO call is translated to chat before it gets here")

    def render(self, data: dict[str, Any], translation: Translation) -> dict[str, Any]:
        answer, self._reply = self.answerer.render(data)
        if self.outer is None:
            return answer
        return self.outer.family.render(answer, self.outer.translation)

    def stream(self, translation: Translation) -> StreamTranslator:
        outer = None
        if self.outer is not None:
            outer = self.outer.family.stream(self.outer.translation)
        self._streamed = TitoStream(self.answerer, outer)
        return self._streamed

    def stored(self, engine_answer: dict[str, Any]) -> dict[str, Any]:
        """The `response` the call's row keeps: the engine's answer in chat's form, as on the
        chat path (what builders, evaluators and the dashboard read), ids and logprobs in it."""
        if "choices" in engine_answer:
            answer, _ = self.answerer.render(engine_answer, stored=True)
            return answer
        summary: dict[str, Any] = self.answerer.stored_summary(engine_answer, self.reply())
        return summary

    def reply(self) -> dict[str, Any] | None:
        return self._streamed.reply if self._streamed is not None else self._reply

    def error_response(self, status: int, kind: str, message: str) -> Response:
        if self.outer is not None:
            return self.outer.family.error_response(status, kind, message)
        error = {"message": message, "type": kind, "code": status}
        return Response(orjson.dumps({"error": error}), status, media_type="application/json")
