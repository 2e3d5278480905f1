"""A task instance as the stages read it: `TaskInstance`, a typed read-only view of the stored JSON.

A task is free-form JSON except for its non-blank `instruction` (the door checks it, with the SWE
fields `repo` and `tests`: `jobs.schemas`). The stored form (`JobTask.instance`) is never rewritten:
the view keeps it as it was read and types only what the platform itself reads, so a field a user's
evaluator needs reaches it unchanged (`as_dict`), and `extra` holds everything the platform does
not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

KNOWN_KEYS = frozenset({"instruction", "answer", "reference", "metadata", "repo", "tests"})
"""The keys the platform reads (`instruction` for the agent; `answer` and `reference` for the
built-in evaluators; `metadata` for the tasks file; `repo` and `tests` for SWE tasks)."""


@dataclass(frozen=True, slots=True)
class TaskInstance:
    """One task of a job, read-only: attributes for the known keys, `stored` for the whole."""

    stored: Mapping[str, Any]
    """The task as stored, read-only (`of` copies it: the cached view is shared by every stage of
    the process, so nobody may change it under another)."""

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> TaskInstance:
        return cls(MappingProxyType(dict(data)))

    @property
    def instruction(self) -> str:
        """What the agent is asked to do. Raises ValueError for a row without a string one (the
        door refuses such a task), in the stage that reads it, as a missing key did."""
        value = self.stored.get("instruction")
        if not isinstance(value, str):
            raise ValueError(f"task instance has no string instruction (got {value!r})")
        return value

    @property
    def answer(self) -> object:
        """The expected answer (a string, a number or a list of them), None when not given."""
        return self.stored.get("answer")

    @property
    def reference(self) -> object:
        """A reference solution for judges, None when not given."""
        return self.stored.get("reference")

    @property
    def metadata(self) -> Mapping[str, Any]:
        value = self.stored.get("metadata")
        return value if isinstance(value, Mapping) else {}

    @property
    def repo(self) -> object:
        """The repository to check out, as submitted (`swe.spec.parse_repo` reads it), or None."""
        return self.stored.get("repo")

    @property
    def tests(self) -> object:
        """The hidden tests, as submitted (`swe.spec.parse_tests` reads them), or None."""
        return self.stored.get("tests")

    @property
    def extra(self) -> Mapping[str, Any]:
        """Every other field, in stored order: the evaluator's own."""
        return {key: value for key, value in self.stored.items() if key not in KNOWN_KEYS}

    def as_dict(self) -> dict[str, Any]:
        """The stored form as a new dict (shallow), for a reader that takes one (evaluators)."""
        return dict(self.stored)
