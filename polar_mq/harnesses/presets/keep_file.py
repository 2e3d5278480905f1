"""Running a harness, then keeping a file it writes (or its output) under a fixed name.

Some harnesses write their transcript under a generated name (a date, a session id); an artifact
needs a fixed workspace-relative path. `then_copy` wraps the harness's argv in `sh -c` so the
newest file matching a glob is copied to that path when the harness exits, and the harness's exit
status is kept. The harness's own arguments stay separate argv entries (`"$@"`), so nothing of
them reaches the shell. A harness killed on timeout leaves no copy (its `agent.log` remains).
"""

from __future__ import annotations

import shlex


def then_copy(source_glob: str, destination: str, name: str) -> list[str]:
    """argv prefix: `[*then_copy(...), program, *args]` runs the program, then copies.

    `source_glob` and `destination` are shell words written by the preset (constants that may use
    `"$VAR"`, never user input); `name` is `$0` of the wrapper (shown in its error messages).
    """
    script = (
        '"$@"; status=$?; newest=$(ls -t ' + source_glob + " 2>/dev/null | head -n 1); "
        '[ -n "$newest" ] && cp "$newest" ' + destination + "; exit $status"
    )
    return ["sh", "-c", script, name]


def tee_keeping_status(
    program: list[str], workdir: str, state_dir: str, transcript: str, status: str
) -> str:
    """A command line running `program` with `"$POLAR_INSTRUCTION"` as its last argument, its
    stdout copied to `transcript` (it also stays in `agent.log`) and its own exit status kept.

    A pipe's status is its last command's (`tee`), so the program's is written to `status` and
    read back. Paths are workspace-relative; the instruction comes from the environment, so it
    never reaches the shell as text.
    """

    def at(path: str) -> str:
        return shlex.quote(f"{workdir}/{path}")

    script = (
        f"mkdir -p {at(state_dir)} && "
        f'{{ {shlex.join(program)} "$POLAR_INSTRUCTION" < /dev/null; echo $? > {at(status)}; }} '
        f'| tee {at(transcript)}; exit "$(cat {at(status)} 2>/dev/null || echo 1)"'
    )
    return shlex.join(["sh", "-c", script])
