"""Side calls: the LLM calls a harness makes for itself (titles, memory, summaries, token counts).

They are real calls through the proxy, so they are logged, but they are not the policy acting on the
task: training on them teaches the model to write titles, and grading their text scores the wrong
message. A rule recognises them from the chat request the engine was sent (every API family is
translated to chat first, so one shape fits all); matching calls are stored with purpose
`auxiliary`, which the build stage, the answer lookup and staleness all leave out.

The one home of the concept: `rules` (what a harness or a job declares, and the matching, which
the scripted test policy uses too) and `marking` (the run-agent stage marking a finished agent's
calls). `marking` reads the database, so it is not imported here: importing the rules stays light.
"""

from polar_mq.harnesses.auxiliary.rules import (
    AuxiliaryRule,
    CallShape,
    content_text,
    is_auxiliary,
    parse_rules,
)

__all__ = ["AuxiliaryRule", "CallShape", "content_text", "is_auxiliary", "parse_rules"]
