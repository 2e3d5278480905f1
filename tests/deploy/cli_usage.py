"""Find every `polar-mq ...` command line in a deploy file and check it against the real CLI.

Deploy files are text the product never runs in its own tests, so a renamed subcommand or flag
would only show on a user's cluster. This reads the `polar-mq` command tree from the Typer app
(the one `polar-mq` itself runs) and checks each invocation's subcommands and `--flags`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import typer.main

from polar_mq.cli import app

_INVOCATION = re.compile(r"(?<![\w./-])polar-mq\s+([^|;&>#\n]*)")


@dataclass(frozen=True)
class Invocation:
    line: int
    words: list[str]


def command_tree() -> Any:
    """The root command (Typer's own copy of click: groups are known by their `commands`)."""
    root = typer.main.get_command(app)
    assert hasattr(root, "commands")
    return root


def invocations(text: str) -> Iterator[Invocation]:
    """`polar-mq` command lines (continuation lines joined) with the words after `polar-mq`.

    Comment lines are prose (checked by reading); a quoted word (`"$VAR"`) or a YAML/JSON list
    item (`"worker",`) is kept as a plain word."""
    joined = re.sub(r"\\\n", " ", text)
    for number, line in enumerate(joined.splitlines(), start=1):
        if line.lstrip().startswith("#"):
            continue
        for match in _INVOCATION.finditer(line):
            words = [w.strip("\"',[]") for w in match.group(1).split()]
            yield Invocation(number, [w for w in words if w])


def unknown_usage(words: list[str], root: Any = None) -> list[str]:
    """What in `words` (after `polar-mq`) the CLI does not have: an empty list when all is known."""
    root = root or command_tree()
    command = root
    rest = list(words)
    while hasattr(command, "commands"):
        if not rest or rest[0].startswith("-"):
            return [] if command is not root else ["no subcommand"]
        name = rest.pop(0)
        sub = command.commands.get(name)
        if sub is None:
            return [f"unknown subcommand {name!r}"]
        command = sub
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    flags = [w.split("=", 1)[0] for w in rest if w.startswith("--")]
    return [f"{command.name}: unknown option {flag}" for flag in flags if flag not in options]
