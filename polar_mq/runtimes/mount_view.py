"""The child half of `local`'s private view: hide paths in a mount namespace, then become the agent.

Run by the worker (root) in place of an agent command:
`python -I -S mount_view.py STATUS_FD UID GID CWD [--hide P | --keep P | --keep-rw P |
--private-tmp P]... -- COMMAND...`. It enters a new mount namespace of
its own (nothing it mounts reaches the node's), covers each `hide` path with an empty read-only
tmpfs (a file with an empty read-only file), covers each `private-tmp` directory (`/tmp`,
`/dev/shm`, `/var/tmp`) with an empty writable tmpfs of its own (sticky, like the node's: what the
agent writes there is never on the node and is gone with the command's last process), binds each
`keep` path back at its own path (opened
before anything was covered, so it is the node's), switches to the agent's uid and gid for good
and becomes COMMAND: the command keeps the pid the worker supervises and the environment tags
that find it. A mount namespace, unlike a pid namespace, does not end with its first process, so
background processes live on, each with the view it started with.

What cannot be set up is written to STATUS_FD and the program exits 125 without running the
command; on success the descriptor closes at exec, so the worker reads nothing. The worker reads
it after the command, so a failure here is the platform's (raised), never an exit status the agent
could fake. `--probe DIR` only checks that this node lets it mount (a tmpfs over DIR), for the
worker's once-per-process check. Standard library only and no polar_mq imports.
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
SETUP_FAILED = 125
_COVER = MS_NOSUID | MS_NODEV | MS_NOEXEC
# enter, not list: the agent reaches the paths bound back below a cover, nothing else
_COVER_DATA = b"mode=0711,size=64k,nr_inodes=256"
_PRIVATE_TMP_DATA = b"mode=1777"

_libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter runs on


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: bytes = b""
) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data or None,
        ),
        f"mount {target}",
    )


def private_namespace() -> None:
    """A mount namespace of this process's own whose mounts propagate nowhere."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def build_view(
    hide: list[str], keep: list[tuple[str, bool]], private: list[str] | None = None
) -> None:
    """Cover `hide` and give each `private` directory a writable tmpfs, bind `keep` back
    (writable when flagged), then cover what is to be hidden inside a path bound back; every
    `hide` cover ends read-only."""
    sources = {path: os.open(path, os.O_PATH) for path, _ in keep if os.path.lexists(path)}
    covers: list[str] = []
    tops = [*hide, *(private or [])]
    inner = [path for path in hide if any(_below(path, other) for other in tops)]
    mounted: list[str] = []
    for path in sorted(set(tops) - set(inner), key=_depth):
        if path in hide:
            _cover(path, covers)
        elif os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, _PRIVATE_TMP_DATA)
            mounted.append(path)
    for path, writable in sorted(keep, key=lambda item: _depth(item[0])):
        if path not in sources or not any(_below(path, c) for c in [*covers, *mounted]):
            continue  # visible anyway
        source = f"/proc/self/fd/{sources[path]}"  # the node's, though covered by now
        _mount_point(path, os.path.isdir(source))
        _mount(source, path, None, MS_BIND | MS_REC)
        if not writable:
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for path in sorted(inner, key=_depth):
        if any(_below(path, k) for k, _ in keep):  # visible again through a bind: cover it there
            _cover(path, covers)
    for path in covers:
        _mount(None, path, None, MS_REMOUNT | MS_RDONLY | _COVER)
    for fd in sources.values():
        os.close(fd)


def _cover(path: str, covers: list[str]) -> None:
    """An empty tmpfs over a directory (made read-only at the end), /dev/null over a file."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", _COVER, _COVER_DATA)
        covers.append(path)
    else:
        _mount("/dev/null", path, None, MS_BIND)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _COVER)


def _mount_point(path: str, is_dir: bool) -> None:
    """An empty directory (or file) inside a cover to bind a kept path onto."""
    if os.path.lexists(path):
        return
    os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
    if is_dir:
        os.mkdir(path, 0o755)
    else:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def _below(path: str, top: str) -> bool:
    return path.startswith(top.rstrip("/") + "/")


def become(uid: int, gid: int) -> None:
    """The agent's ids for good (real, effective and saved), no supplementary groups."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def probe(directory: str) -> int:
    private_namespace()
    _mount("tmpfs", directory, "tmpfs", _COVER, _COVER_DATA)
    return 0


def parse(args: list[str]) -> tuple[list[str], list[tuple[str, bool]], list[str], list[str]]:
    """`--hide P`, `--keep P`, `--keep-rw P`, `--private-tmp P` up to `--`, then the command
    (standard library only and no json: this runs before every agent command, its start-up time
    counts). Returns (hide, keep, command, private)."""
    hide: list[str] = []
    keep: list[tuple[str, bool]] = []
    private: list[str] = []
    index = 0
    while args[index] != "--":
        flag, path = args[index], args[index + 1]
        if flag == "--hide":
            hide.append(path)
        elif flag == "--private-tmp":
            private.append(path)
        elif flag in ("--keep", "--keep-rw"):
            keep.append((path, flag == "--keep-rw"))
        else:
            raise ValueError(f"unknown option {flag!r}")
        index += 2
    return hide, keep, args[index + 1 :], private


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--probe":
        return probe(argv[1])
    status = int(argv[0])
    try:
        uid, gid, cwd = int(argv[1]), int(argv[2]), argv[3]
        hide, keep, command, private = parse(argv[4:])
        if not command:
            raise ValueError("no command")
        private_namespace()
        build_view(hide, keep, private)
        become(uid, gid)
        os.chdir(cwd)
    except (OSError, ValueError, IndexError) as exc:
        os.write(status, f"{exc}".encode())
        return SETUP_FAILED
    os.set_inheritable(status, False)  # closed by exec: the worker reads no error
    try:
        os.execvp(command[0], command)
    except OSError as exc:  # like a shell: not found 127, not executable 126
        sys.stderr.write(f"{command[0]}: {exc.strerror}\n")
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
