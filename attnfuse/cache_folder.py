"""Where the kernel cache lives: the configured folder (`$ATTNFUSE_CACHE_DIR`, default
`~/.cache/attnfuse`), the checks that it may be trusted, and this process's private
temporary folder, the fallback of one that may not (see `attnfuse.cache`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from attnfuse.errors import AttnFuseError


def cache_dir() -> Path:
    """Where kernels live: `$ATTNFUSE_CACHE_DIR` (a leading `~` and `$VARIABLES` in it
    expanded), default `~/.cache/attnfuse`."""
    configured = os.environ.get("ATTNFUSE_CACHE_DIR")
    if configured:
        return Path(os.path.expanduser(os.path.expandvars(configured)))
    return Path.home() / ".cache" / "attnfuse"


def untrusted(st: os.stat_result) -> str | None:
    """Why a file or folder of status `st` may hold what others wrote ("is owned by ...",
    "is writable by ..."), or None: it must be owned by this user and writable by nobody
    else."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"is owned by user id {st.st_uid}, not by this user ({os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by others (mode {stat.filemode(st.st_mode)})"
    return None


def _unusable(folder: Path) -> str | None:
    """Why kernels cannot be cached in `folder` (created with mode 0700 if missing), or None."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError as e:
        return f"cannot be created ({e})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if reason := untrusted(st):
        return reason
    if not os.access(folder, os.W_OK | os.X_OK):
        return "is not writable"
    return None


_fallback: Path | None = None
_fallback_lock = threading.Lock()
_warned: set[str] = set()


def private_folder(why: str = "") -> Path:
    """This process's private temporary kernel folder (created once, mode 0700, removed at
    exit): the fallback of an unusable cache folder, and where a kernel whose lock timed
    out is compiled. Where not even it can be created, an `AttnFuseError` (starting "AttnFuse
    {why}cannot create") names the temporary folder and `ATTNFUSE_CACHE_DIR`."""
    global _fallback
    with _fallback_lock:
        if _fallback is None:
            try:
                root = tempfile.mkdtemp(prefix="attnfuse-cache-")
                (Path(root) / "kernels").mkdir(mode=0o700)
            except OSError as e:
                raise AttnFuseError(
                    f"AttnFuse {why}cannot create a temporary kernel folder in {_temp_root()} ({e}); set "
                    f"ATTNFUSE_CACHE_DIR to a folder of yours with room to write, that only you can write to (and "
                    f"check TMPDIR and the file size limit, ulimit -f)"
                ) from e
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            _fallback = Path(root) / "kernels"
        return _fallback


def _temp_root() -> str:
    """Where temporary folders go, as far as it can be told (`tempfile.gettempdir` itself
    fails where no candidate folder can hold a file)."""
    try:
        return tempfile.gettempdir()
    except OSError:
        return "any temporary folder"


def fallback() -> Path | None:
    """The private temporary folder, if this process has created it."""
    return _fallback


def fall_back(configured: Path, reason: str) -> Path:
    """`private_folder()`, after one warning per unusable configured folder."""
    folder = private_folder(f"cannot use the kernel cache folder {configured} ({reason}), and ")
    with _fallback_lock:
        if str(configured) not in _warned:
            _warned.add(str(configured))
            warnings.warn(
                f"AttnFuse cannot use the kernel cache folder {configured}: {reason}. Kernels are cached in "
                f"{folder.parent} for this process only; set ATTNFUSE_CACHE_DIR to a folder of yours that "
                f"only you can write to.",
                RuntimeWarning,
                stacklevel=2,
            )
    return folder


def kernel_folder() -> Path:
    """The folder kernel files go to: `cache_dir()/kernels` when both folders are usable
    (see `attnfuse.cache`), else this process's private temporary folder."""
    configured = cache_dir()
    for folder in (configured, configured / "kernels"):
        if reason := _unusable(folder):
            return fall_back(configured, f"{folder} {reason}")
    return configured / "kernels"


def _after_fork_in_child() -> None:
    """Make the lock anew in a forked child (see `attnfuse.cache_loader`)."""
    global _fallback_lock
    _fallback_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
