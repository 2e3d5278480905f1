"""Running a harness, then keeping a file it writes under a name it does not choose.

Some harnesses write their transcript under a generated name (a date, a session id); an artifact
needs a fixed workspace-relative path. `then_copy` wraps the harness's argv in `sh -c` so the
newest file matching a glob is copied to that path when the harness exits, and the harness's exit
status is kept. The harness's own arguments stay separate argv entries (`"$@"`), so nothing of
them reaches the shell. A harness killed on timeout leaves no copy (its `agent.log` remains).
"""

from __future__ import annotations


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
