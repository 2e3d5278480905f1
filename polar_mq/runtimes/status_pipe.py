"""A pipe a command's setup reports its failure on, so the platform's failure is never the agent's.

The writing end goes to the child (`pass_fds`); the setup that runs there before the agent's
program (the `local` view helper, the kill group's join) writes why it failed and exits, or closes
its end when it execs the program. Read after the command: empty means the setup succeeded, and
the agent cannot write it (its program never holds the descriptor).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


@contextmanager
def status_channel() -> Iterator[StatusPipe]:
    """A pipe for one command's setup to report a failure on."""
    read_fd, write_fd = os.pipe()
    pipe = StatusPipe(read_fd, write_fd)
    try:
        yield pipe
    finally:
        pipe.close()


class StatusPipe:
    """Read after the command: empty when the setup reached the program (its end closed at exec)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd: int | None = write_fd

    @property
    def fd(self) -> int:
        assert self.write_fd is not None
        return self.write_fd

    def failure(self) -> str | None:
        """The setup's error, None when it reached the command."""
        self._close_write()
        data = b"".join(_read_all(self.read_fd))
        return data.decode(errors="replace") or None

    def _close_write(self) -> None:
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def close(self) -> None:
        self._close_write()
        os.close(self.read_fd)


def _read_all(fd: int) -> Iterable[bytes]:
    while chunk := os.read(fd, 4096):
        yield chunk
