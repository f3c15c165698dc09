"""The kernel cache under faults: a process that stalls holding a kernel's lock
(`ATTNFUSE_LOCK_TIMEOUT`), a fork while another thread holds the interpreter's or a
file's lock, a cache that cannot be written anywhere (`ulimit -f`, no temporary folder),
and a cache folder written with `~` or `$VARIABLES`.

The lock and write tests compile with the stand-in compiler (stub_compiler.py); the fork
test runs a real kernel under the interpreter."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import stub_compiler
import torch

import attnfuse as af
from attnfuse import cache, cache_folder, cache_loader, runtime
from attnfuse.cache_lock import LOCK_TIMEOUT_ENV, file_lock, lock_timeout
from attnfuse.reference import run_reference

HERE = Path(__file__).parent
FORK = multiprocessing.get_context("fork")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache folder, no kernels in memory, and no private folder yet."""
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNFUSE_BACKEND", raising=False)
    monkeypatch.delenv(LOCK_TIMEOUT_ENV, raising=False)
    runtime.clear_caches()
    yield tmp_path / "cache"
    runtime.clear_caches()


@af.variant
def causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def qkv(n: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, n, 16, generator=g) for _ in range(3))


def stub_kernel(*x: torch.Tensor) -> af.Kernel:
    """causal's interpreted kernel for `x`, compiled by the stand-in compiler."""
    with af.backend("interpret"), cache.use_compiler(stub_compiler.reference_compile):
        return causal.compile(*x)


def compiles() -> int:
    return runtime.stats()["compiles"]


# --------------------------------------------------------------------------- a stalled lock holder


class Holder:
    """Another process holding the lock file `path` (until `stop`), as a process stopped
    by Ctrl-Z or in a debugger does."""

    def __init__(self, path: Path):
        code = (
            "import sys, time\n"
            "from pathlib import Path\n"
            "from attnfuse.cache_lock import file_lock\n"
            "with file_lock(Path(sys.argv[1]), timeout=0) as holder:\n"
            "    print('held' if holder is None else 'busy', flush=True)\n"
            "    time.sleep(120)\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "held"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def stalled_entry(fresh_cache: Path, *, keep_file: bool) -> tuple[Path, Holder]:
    """Put causal's kernel for qkv() in the disk cache (and delete its file unless
    `keep_file`), forget it in memory, and have another process hold its lock."""
    path = Path(stub_kernel(*qkv()).path)
    if not keep_file:
        path.unlink()
    runtime.clear_caches()
    return path, Holder(path.with_suffix(".lock"))


def call_past_the_holder(monkeypatch: pytest.MonkeyPatch) -> tuple[af.Kernel, list[str], float]:
    """causal's kernel for qkv() with a 0.5 s lock timeout: the kernel, the warnings, the seconds."""
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "0.5")
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = stub_kernel(*qkv())
    return kernel, [str(w.message) for w in caught], time.monotonic() - start


def test_a_stalled_lock_holder_is_named_and_the_kernel_compiled_privately(fresh_cache, monkeypatch):
    path, holder = stalled_entry(fresh_cache, keep_file=False)
    try:
        before = compiles()
        kernel, messages, seconds = call_past_the_holder(monkeypatch)
        assert not path.exists()  # the shared entry is left to its holder
    finally:
        holder.stop()
    (message,) = messages
    assert f"held by process {holder.proc.pid}" in message
    assert f"waited 0.5 s for the kernel cache lock {path.with_suffix('.lock')}" in message
    assert LOCK_TIMEOUT_ENV in message
    assert seconds < 30
    assert compiles() == before + 1
    assert Path(kernel.path).parent == cache_folder.private_folder()
    x = qkv()
    torch.testing.assert_close(kernel(*x).double(), run_reference(causal.ir_module(*x), *x), atol=1e-5, rtol=1e-5)


def test_past_a_stalled_holder_a_complete_file_is_loaded(fresh_cache, monkeypatch):
    path, holder = stalled_entry(fresh_cache, keep_file=True)
    try:
        before = runtime.stats()
        kernel, messages, _ = call_past_the_holder(monkeypatch)
    finally:
        holder.stop()
    assert len(messages) == 1 and f"held by process {holder.proc.pid}" in messages[0]
    after = runtime.stats()
    assert (after["compiles"], after["disk_loads"]) == (before["compiles"], before["disk_loads"] + 1)
    assert Path(kernel.path) == path


def test_the_lock_file_names_its_holder_and_a_waiter_gets_the_lock_once_freed(tmp_path):
    path = tmp_path / "entry.lock"
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with file_lock(path) as holder:
            assert holder is None
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(30)
    assert path.read_text() == f"{os.getpid()}\n"
    with file_lock(path, timeout=0.05) as holder:  # flock: another open file of the same process waits too
        assert holder == f"process {os.getpid()}"
    threading.Timer(0.2, release.set).start()
    start = time.monotonic()
    with file_lock(path, timeout=30) as holder:
        assert holder is None
    assert time.monotonic() - start < 20
    thread.join(timeout=30)


@pytest.mark.parametrize("value", ["soon", "-1", "nan", ""])
def test_the_lock_timeout_variable(monkeypatch, value):
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, value)
    if value == "":
        assert lock_timeout() == 60.0
        return
    with pytest.raises(af.AttnFuseError, match=f"{LOCK_TIMEOUT_ENV}='{value}' is not a time .* seconds >= 0"):
        lock_timeout()


def test_an_infinite_lock_timeout_is_allowed(monkeypatch):
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "inf")
    assert lock_timeout() == float("inf")


# --------------------------------------------------------------------------- fork


def _interpreted_call_in_child(kernel: af.Kernel, x: tuple[torch.Tensor, ...], expected: torch.Tensor) -> None:
    """In a forked child: the interpreted call must return `expected` (exit 3 otherwise),
    and leave Triton's library as it was before the parent's holder swapped it (exit 2)."""
    right = torch.equal(kernel(*x), expected)
    pristine = all(getattr(o, a) is f for o, a, f, _ in cache_loader._library_swaps or [])
    os._exit(3 if not right else 0 if pristine else 2)


def test_a_fork_while_a_thread_holds_the_interpreter_lock():
    x = qkv()
    with af.backend("interpret"):
        kernel = causal.compile(*x)  # the real compiler: an interpreted Triton kernel
    expected = kernel(*x)
    exitcode = fork_while_held(cache_loader.interpreter_library(), _interpreted_call_in_child, (kernel, x, expected))
    assert exitcode is not None, "the forked child's interpreted call did not return"
    assert exitcode == 0


def fork_while_held(lock: contextlib.AbstractContextManager, target: Callable, args: tuple = ()) -> int | None:
    """Fork a child running `target(*args)` while another thread holds `lock`; its exit
    code, or None if it had not returned after 60 s (it is then killed)."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            inside.set()
            release.wait(120)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert inside.wait(30)
        child = FORK.Process(target=target, args=args)
        child.start()
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join()
            return None
        return child.exitcode
    finally:
        release.set()
        thread.join(timeout=60)


def _clear_in_child() -> None:
    """In a forked child: forgetting the autograd targets takes the registry's lock.
    (No torch arithmetic here: OpenMP's pool may not survive a fork, whatever we do.)"""
    af.runtime.clear_caches()
    os._exit(0)


def test_a_fork_while_a_thread_holds_the_autograd_registry_lock():
    from attnfuse import autograd

    exitcode = fork_while_held(autograd._registry_lock, _clear_in_child)
    assert exitcode is not None, "the forked child waited for a lock its parent's thread held"
    assert exitcode == 0


def test_a_child_forked_while_a_lock_file_is_held_does_not_keep_it(tmp_path):
    path = tmp_path / "entry.lock"
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with file_lock(path):
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(30)
    child = FORK.Process(target=time.sleep, args=(60,))
    child.start()
    try:
        release.set()
        thread.join(timeout=30)
        with file_lock(path, timeout=2) as holder:
            assert holder is None
    finally:
        child.kill()
        child.join()


# --------------------------------------------------------------------------- nowhere to write


CHILD_UNDER_ULIMIT = """
import resource, sys
sys.path.insert(0, {here!r})
import stub_compiler, torch
import attnfuse as af
from attnfuse import cache

@af.variant
def plain(q, k, v):
    return af.pv(af.softmax(af.qk(q, k)), v)

x = [torch.randn(1, 2, 8, 16) for _ in range(3)]
cache.triton_version(), cache.version_fingerprint()
if {fallback_first!r}:
    cache.cache_folder.private_folder()
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    with af.backend("interpret"), cache.use_compiler(stub_compiler.reference_compile):
        plain(*x)
except af.AttnFuseError as e:
    print("AttnFuseError:", e)
"""


@pytest.mark.parametrize("fallback_first", [False, True])
def test_a_file_size_limit_of_zero_is_an_error_naming_the_folders(fresh_cache, tmp_path, fallback_first):
    """`ulimit -f 0`: neither the cache folder nor a temporary one can hold a file (the
    temporary folder, when it was made before the limit, cannot hold the kernel)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD_UNDER_ULIMIT.format(here=str(HERE), fallback_first=fallback_first))
    env = {**os.environ, "ATTNFUSE_CACHE_DIR": str(fresh_cache)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    message = done.stdout.strip()
    assert message.startswith("AttnFuseError: AttnFuse cannot "), message + done.stderr[-2000:]
    assert "ATTNFUSE_CACHE_DIR" in message and "File too large" in message and "ulimit -f" in message
    if fallback_first:
        assert f"neither into the kernel cache folder {fresh_cache} " in message
        assert "nor into its temporary fallback /" in message
    else:
        assert f"cannot use the kernel cache folder {fresh_cache} ({fresh_cache / 'kernels'}/" in message
        assert "and cannot create a temporary kernel folder" in message


def test_no_temporary_folder_is_an_error_naming_it(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(blocker / "cache"))  # unusable: falls back
    monkeypatch.setattr(tempfile, "tempdir", str(blocker))  # and no temporary folder either
    monkeypatch.setattr(cache_folder, "_fallback", None)
    with (
        pytest.raises(af.AttnFuseError, match=rf"temporary kernel folder in {re.escape(str(blocker))} .*CACHE_DIR"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        stub_kernel(*qkv())


# --------------------------------------------------------------------------- the folder's name


@pytest.mark.parametrize("configured", ["~/kernels-here", "$ATTNFUSE_TEST_ROOT/kernels-here"])
def test_a_cache_folder_with_a_tilde_or_a_variable_is_expanded(tmp_path, monkeypatch, configured):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ATTNFUSE_TEST_ROOT", str(tmp_path / "home"))
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", configured)
    monkeypatch.chdir(tmp_path)
    assert cache.cache_dir() == tmp_path / "home" / "kernels-here"
    kernel = stub_kernel(*qkv())
    assert Path(kernel.path).parent == tmp_path / "home" / "kernels-here" / "kernels"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no folder named "~" or "$ATTNFUSE_TEST_ROOT"
