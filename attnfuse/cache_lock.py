"""The kernel cache's lock between processes: an exclusive `fcntl.flock` on an entry's
lock file, taken with a time limit.

The process holding the lock writes its PID into the lock file. A process that waits
longer than `$ATTNFUSE_LOCK_TIMEOUT` seconds (default 60; `inf` waits for ever, 0 not at
all) goes on without the lock and learns who holds it: a process stopped with Ctrl-Z or
in a debugger while it holds a kernel's lock must not block every other process needing
that kernel (every `torchrun` rank would wait the same way). What the waiter does then is
the cache's choice (`attnfuse.cache.KernelCache.get` compiles privately).

The lock belongs to the open file, which a forked child shares: a child forked while a
thread holds a lock would keep it held after the parent releases it, for as long as the
child lives (a data-loader worker). The child closes its copies of the lock files
(`os.register_at_fork`); closing, unlike unlocking, leaves the parent's lock in place.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from attnfuse.errors import AttnFuseError

LOCK_TIMEOUT_ENV = "ATTNFUSE_LOCK_TIMEOUT"
"""The environment variable giving how long to wait for a kernel's cache lock, in seconds."""

DEFAULT_LOCK_TIMEOUT = 60.0

_held: dict[int, int] = {}
"""The file descriptors of the lock files this process has open (held or being waited for),
each with the identity of the thread that opened it."""


def lock_timeout() -> float:
    """How long to wait for a kernel's cache lock: `$ATTNFUSE_LOCK_TIMEOUT` seconds, default
    60. A value that is not a number of seconds >= 0 (`inf` allowed) is an `AttnFuseError`."""
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:  # NaN too
        raise AttnFuseError(
            f"{LOCK_TIMEOUT_ENV}={raw!r} is not a time to wait for a kernel's cache lock; expected a number of "
            f"seconds >= 0 (or inf), such as {DEFAULT_LOCK_TIMEOUT:g}"
        )
    return seconds


def lock_holder(path: Path) -> str:
    """Who holds the lock file `path`, from the PID its holder wrote: "process 1234", or
    "another process (it left no PID)"."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(path.read_text(encoding="ascii").split()[0])
        return f"process {pid}"
    return "another process (it left no PID)"


def _acquire(fd: int, timeout: float) -> bool:
    """Take the exclusive lock on `fd` within `timeout` seconds; whether it was taken."""
    import fcntl

    deadline, pause = time.monotonic() + timeout, 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.1)


def _write_pid(fd: int) -> None:
    """Record this process as the holder; a file that cannot be written (a full disk,
    `ulimit -f`) only leaves the holder unnamed."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


@contextlib.contextmanager
def file_lock(path: Path, timeout: float | None = None) -> Iterator[str | None]:
    """Hold an exclusive `flock` on `path` (created with mode 0600) inside the block, waiting
    at most `timeout` seconds (default `lock_timeout()`). The block gets None when it holds
    the lock, or, after the wait ran out, the holder (`lock_holder`): it then runs without
    the lock. Where the lock file cannot be opened (or there is no `fcntl`), the block runs
    unlocked and gets None: atomic writes keep the cache valid, only the work may be
    repeated."""
    wait = lock_timeout() if timeout is None else timeout
    try:
        import fcntl  # noqa: F401  (POSIX only)

        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC, 0o600)
    except (ImportError, OSError):  # no fcntl (not POSIX), or no lock file
        yield None
        return
    _held[fd] = threading.get_ident()
    try:
        if _acquire(fd, wait):
            _write_pid(fd)
            yield None
        else:
            yield lock_holder(path)
    finally:
        _held.pop(fd, None)
        os.close(fd)  # releases the lock


def _after_fork_in_child() -> None:
    """Close the child's copies of the lock files that threads other than the forking one
    had open (see the module docstring): those threads do not run in the child. The forking
    thread's own (a plain `os.fork` inside the block) stay open: it closes them itself."""
    me = threading.get_ident()
    for fd, owner in list(_held.items()):
        if owner != me:
            del _held[fd]
            with contextlib.suppress(OSError):
                os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
