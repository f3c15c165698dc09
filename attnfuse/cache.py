"""The kernel cache: generated Triton modules, on disk and in memory.

A kernel is identified by a key, the sha256 of: the variant's canonical IR text, the
q/k/v dtypes, head counts and head dims, the sequence-length bucket, the SM version
(compute capability, 0 under the interpreter), whether it runs interpreted, its
direction (the forward, or the backward and the arguments it differentiates), the
Triton version and the AttnFuse version (plus a fingerprint of AttnFuse's sources,
so that a changed compiler never serves a stale kernel). Backward kernels are compiled
from the forward's IR (the compiler derives the backward) and cached like forward ones.

On disk (`$ATTNFUSE_CACHE_DIR`, default `~/.cache/attnfuse`), a kernel is one Python
file `kernels/<key>.py`: the generated source, a comment line carrying the launch
parameters as JSON, and a last comment line with the sha256 of the key and everything
before it. It is written to a temporary file in the same folder and renamed into place
(`os.replace`), so readers never see a partial file. A `<key>.mlir` beside it holds the
IR, for people; `<key>.lock` is the entry's lock file (holding its holder's PID).

The disk is untrusted input, since importing a cache file runs it:

- The cache folder and its `kernels` folder must be owned by the user and writable by
  nobody else; they are created with mode 0700. A folder that fails this, or cannot be
  created or written (read-only, `HOME` unwritable, a full disk), is not used: kernels
  go to a private temporary folder for the rest of the process, with one warning that
  names `ATTNFUSE_CACHE_DIR`.
- A kernel file is imported only when it is a regular file owned by the user, writable
  by nobody else (files are written with mode 0600), and its last line holds the right
  hash. Otherwise, or when importing it raises anything (`SystemExit` included; only
  `KeyboardInterrupt` propagates), a warning says why and the kernel is compiled again,
  replacing the file.
- A kernel read from disk is trusted after its first launch: if that launch raises,
  the file is deleted, the kernel compiled again and launched once more
  (`KernelCache.launcher`).

There is no shared-cache mode: a folder others may write to is refused, not shared.

Concurrency: within a process, one lock per key serialises the lookup, compilation and
import of that kernel (other kernels proceed). Across processes, an exclusive
`fcntl.flock` on the entry's lock file does the same: one process compiles, the others
wait and then load its file (`torchrun` ranks starting cold). The wait is limited
(`attnfuse.cache_lock`: `$ATTNFUSE_LOCK_TIMEOUT`, 60 s): a process that waited longer for
a holder that has stalled (Ctrl-Z, a debugger) warns, naming the holder's PID, and goes
on without the lock: it loads the entry's file if one is complete, else compiles the
kernel privately, into its temporary folder, leaving the shared entry to the holder.
Interpreted launches are serialised (`interpreter_library`): Triton's interpreter
patches `triton.language` globally while a kernel runs. A forked child makes these
locks anew (`os.register_at_fork`).

The parts: `attnfuse.cache_folder` (where kernels live, which folder is trusted, the
fallback), `attnfuse.cache_lock` (the lock between processes) and `attnfuse.cache_loader`
(the import of generated modules: `load_module`, `load_source`, `interpreter_library`,
re-exported here).

`ATTNFUSE_DUMP_IR` (see `attnfuse.compiler.compile_module`) dumps a kernel's IR when it
is compiled; a kernel loaded from the disk cache is compiled once more for its dump (only
while the variable is set, and only by `attnfuse.compiler`, not a stand-in of
`use_compiler`). The reference backend compiles nothing: it warns once that nothing is
dumped (`warn_reference_dumps_nothing`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import os
import stat
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from xdsl.dialects.builtin import ModuleOp

import attnfuse
from attnfuse import cache_folder
from attnfuse.cache_folder import cache_dir as cache_dir
from attnfuse.cache_folder import kernel_folder as kernel_folder
from attnfuse.cache_folder import private_folder, untrusted
from attnfuse.cache_loader import interpreter_library as interpreter_library
from attnfuse.cache_loader import load_module as load_module
from attnfuse.cache_loader import load_source as load_source
from attnfuse.cache_loader import require_interpretable_numpy
from attnfuse.cache_lock import LOCK_TIMEOUT_ENV, file_lock, lock_timeout
from attnfuse.errors import AttnFuseError

_PARAMS_MARK = "# attnfuse-launch-params: "
_HASH_MARK = "# attnfuse-sha256: "

CompileFn = Callable[..., Any]
"""`compile_module(module, *, sm, seq_len)` returning an object with `.source` (Python
text defining `launch(q, k, v, *extra_tensors) -> (out, lse)`) and `.launch_params` (a
dict). For a backward kernel it is called as `compile_module(module, *, sm, seq_len,
direction="bwd", wrt=(...))`, and `launch(q, k, v, *extra_tensors, out, lse, dout)`
returns one gradient per index of `wrt` (indices of the function's arguments: 0, 1, 2 for
q, k, v, 3... for its extra tensors); a forward is compiled without those keywords, so a
compile function that only knows the forward still serves forward kernels."""

_compiler_override: CompileFn | None = None


def _compile_fn() -> CompileFn:
    if _compiler_override is not None:
        return _compiler_override
    try:
        from attnfuse.compiler import compile_module
    except ImportError as e:
        raise RuntimeError(
            f"the triton and interpret backends need attnfuse.compiler.compile_module, which cannot "
            f"be imported ({e}); use the reference backend meanwhile"
        ) from e
    return compile_module


_backward_support: dict[Any, bool] = {}


def compiles_backward() -> bool:
    """Whether the compile function in effect builds backward kernels: it declares a
    `direction` parameter (see `CompileFn`)."""
    fn = _compile_fn()
    known = _backward_support.get(fn)
    if known is None:
        try:
            known = "direction" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            known = False
        _backward_support[fn] = known
    return known


@contextlib.contextmanager
def use_compiler(fn: CompileFn | None) -> Iterator[None]:
    """Compile with `fn` instead of `attnfuse.compiler.compile_module` inside the block
    (tests and benchmarks use it to measure the cache with a trivial launch)."""
    global _compiler_override
    old, _compiler_override = _compiler_override, fn
    try:
        yield
    finally:
        _compiler_override = old


_fingerprint: str | None = None


def version_fingerprint() -> str:
    """AttnFuse's version and a hash of its Python sources (package, dialects, passes)."""
    global _fingerprint
    if _fingerprint is None:
        h = hashlib.sha256(attnfuse.__version__.encode())
        roots = {Path(attnfuse.__file__).parent}
        for sub in ("dialects", "passes"):
            with contextlib.suppress(ImportError):
                mod = importlib.import_module(f"attnfuse.{sub}")
                roots.add(Path(mod.__file__).parent)  # type: ignore[arg-type]
        files = sorted(p for root in roots for p in root.rglob("*.py"))
        for p in files:
            h.update(p.name.encode())
            h.update(p.read_bytes())
        _fingerprint = f"{attnfuse.__version__}+{h.hexdigest()[:16]}"
    return _fingerprint


def triton_version() -> str:
    import triton

    return triton.__version__


DIRECTIONS = ("fwd", "bwd", "decode")


@dataclass(frozen=True)
class KernelSpec:
    """Everything a kernel's key covers, besides versions. `direction` is "fwd" (the
    forward: out and lse), "bwd" (the backward) or "decode" (the decode kernels over a KV
    cache, `page_size` 0 for a contiguous one, `splits` 0 for the cost model's); `varlen`: the
    forward or backward over packed sequences; `wrt` are the
    indices of the function arguments a backward kernel differentiates (0, 1, 2 for q, k, v,
    3... for the extra tensors, in order), empty for a forward."""

    ir: str
    dtypes: tuple[str, str, str]
    heads: tuple[int, int]
    head_dims: tuple[int, int]
    seq_bucket: int
    sm: int
    interpret: bool
    direction: str = "fwd"
    wrt: tuple[int, ...] = ()
    page_size: int = 0
    splits: int = 0
    varlen: bool = False

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"a kernel's direction is 'fwd' or 'bwd', got {self.direction!r}")
        if self.direction != "bwd" and self.wrt:
            raise ValueError(f"a forward kernel differentiates nothing, got wrt={self.wrt}")
        if self.direction != "decode" and (self.page_size or self.splits):
            raise ValueError("page_size and splits are a decode kernel's")
        if self.direction == "decode" and self.varlen:
            raise ValueError("a decode kernel is not a varlen one")
        if self.direction == "bwd" and (not self.wrt or list(self.wrt) != sorted(set(self.wrt))):
            raise ValueError(f"a backward kernel needs wrt: increasing argument indices, got {self.wrt}")

    def compile_options(self) -> dict[str, Any]:
        """The keywords the compile function gets besides `sm` and `seq_len`: none for a
        forward, `direction` and `wrt` for a backward, `direction`, `page_size` and
        `decode_splits` for decode kernels, and `varlen` for packed sequences."""
        if self.direction == "decode":
            return {"direction": "decode", "page_size": self.page_size, "decode_splits": self.splits}
        options: dict[str, Any] = {"varlen": True} if self.varlen else {}
        if self.direction == "bwd":
            options |= {"direction": self.direction, "wrt": self.wrt}
        return options

    def key(self) -> str:
        fields = {
            "ir": self.ir,
            "dtypes": list(self.dtypes),
            "heads": list(self.heads),
            "head_dims": list(self.head_dims),
            "seq_bucket": self.seq_bucket,
            "sm": self.sm,
            "interpret": self.interpret,
            "direction": self.direction,
            "wrt": list(self.wrt),
            **({"page_size": self.page_size, "splits": self.splits} if self.direction == "decode" else {}),
            **({"varlen": True} if self.varlen else {}),
            "triton": triton_version(),
            "attnfuse": version_fingerprint(),
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class LoadedKernel:
    """A generated module, imported: `launch(q, k, v, *extras) -> (out, lse)` for a
    forward kernel, `launch(q, k, v, *extras, out, lse, dout) -> (gradients...)` for a
    backward one (see `CompileFn`)."""

    key: str
    path: Path
    source: str
    launch_params: dict[str, Any]
    module: ModuleType
    interpret: bool
    from_disk: bool = False
    """Read from the disk cache (not compiled by this process): see `KernelCache.launcher`."""

    @property
    def launch(self) -> Callable[..., Any]:
        """The module's `launch`; for an interpreted kernel, inside `interpreter_library()`,
        which also serialises interpreted launches."""
        launch = self.module.launch
        if not self.interpret:
            return launch

        def interpreted(*args: Any, **kwargs: Any) -> Any:
            with interpreter_library():
                return launch(*args, **kwargs)

        return interpreted


def seq_bucket(nq: int, nk: int) -> int:
    """The sequence-length bucket: the next power of two of max(Nq, Nk), at least 128.
    (The runtime's hot path computes it on every call.)"""
    n = nq if nq > nk else nk
    return 128 if n <= 128 else 1 << (n - 1).bit_length()


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool | int | float | str) or x is None:
        return x
    return repr(x)


def _digest(key: str, text: str) -> str:
    return hashlib.sha256(f"{key}\n{text}".encode()).hexdigest()


def entry_text(key: str, source: str, launch_params: dict[str, Any]) -> str:
    """The text of the cache file of kernel `key`: the generated `source`, a line of
    launch parameters, and a line with the hash of the key and the lines before it."""
    params = json.dumps(_jsonable(launch_params), sort_keys=True)
    text = f"{source}{_PARAMS_MARK}{params}\n"
    return f"{text}{_HASH_MARK}{_digest(key, text)}\n"


def _split_source(text: str, key: str) -> tuple[str, dict[str, Any]]:
    """The generated source and launch parameters of the cache file of kernel `key`;
    ValueError (a verb phrase: "has no hash line") when the file does not carry the hash
    of its content."""
    body, _, last = text.rstrip("\n").rpartition("\n")
    if not last.startswith(_HASH_MARK):
        raise ValueError("has no hash line")
    if last[len(_HASH_MARK) :] != _digest(key, body + "\n"):
        raise ValueError("does not match the hash written with it (changed or written for another key)")
    source, _, params = body.rpartition("\n")
    if not params.startswith(_PARAMS_MARK):
        raise ValueError("has no launch-parameters line")
    return source + "\n", json.loads(params[len(_PARAMS_MARK) :])


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


_STATS = {"compiles": 0, "disk_loads": 0}

DUMP_IR_ENV = "ATTNFUSE_DUMP_IR"
"""`attnfuse.compiler.DUMP_IR_ENV` (the compiler is imported only to compile)."""


_reference_warned = False


def warn_reference_dumps_nothing() -> None:
    """While `ATTNFUSE_DUMP_IR` is set, warn once per process that the reference backend
    compiles nothing, so dumps nothing (the runtime calls it when a call picks that backend)."""
    global _reference_warned
    if os.environ.get(DUMP_IR_ENV) and not _reference_warned:
        _reference_warned = True
        _warn(
            f"{DUMP_IR_ENV} is set, but the reference backend compiles nothing, so no IR is dumped; run on the "
            f"'interpret' backend (af.backend('interpret')) or on 'triton' to compile and dump the kernels"
        )


def _dump_cached(module: ModuleOp, spec: KernelSpec) -> None:
    """While `ATTNFUSE_DUMP_IR` is set, compile a kernel loaded from the disk cache once more,
    for its dump only (`attnfuse.compiler` only: a stand-in compiler dumps nothing)."""
    if not os.environ.get(DUMP_IR_ENV) or _compiler_override is not None:
        return
    try:
        _compile_fn()(module.clone(), sm=spec.sm, seq_len=spec.seq_bucket, **spec.compile_options())
    except Exception as e:
        _warn(f"AttnFuse dumps no IR ({DUMP_IR_ENV}) of the kernel {spec.key()} it loaded from the cache: {e!r}")


def _write_entry(folder: Path, key: str, text: str, ir: str) -> Path:
    """Write the cache file of kernel `key` (and its IR beside it) into `folder`, else into
    the fallback folder; the file's path. Where neither can hold it (a full disk, `ulimit
    -f`), an `AttnFuseError` names the folders and `ATTNFUSE_CACHE_DIR`."""
    try:
        _write_atomic(folder / f"{key}.py", text)
    except OSError as e:
        if folder == cache_folder.fallback():
            raise _unwritable(folder, e) from e
        folder = cache_folder.fall_back(cache_dir(), f"{folder / f'{key}.py'} cannot be written ({e})")
        try:
            _write_atomic(folder / f"{key}.py", text)
        except OSError as e2:
            raise _unwritable(folder, e2) from e2
    with contextlib.suppress(OSError):
        _write_atomic(folder / f"{key}.mlir", ir)
    return folder / f"{key}.py"


def _unwritable(fallback: Path, e: OSError) -> AttnFuseError:
    return AttnFuseError(
        f"AttnFuse cannot write a compiled kernel, neither into the kernel cache folder {cache_dir()} (from "
        f"ATTNFUSE_CACHE_DIR, default ~/.cache/attnfuse) nor into its temporary fallback {fallback} ({e}); set "
        f"ATTNFUSE_CACHE_DIR to a folder of yours with room to write (and check the file size limit, ulimit -f)"
    )


def _warn_stalled(lock: Path, holder: str) -> None:
    _warn(
        f"AttnFuse waited {lock_timeout():g} s for the kernel cache lock {lock}, held by {holder} (stopped, or in a "
        f"debugger?); it goes on without the lock: it loads the kernel's file if complete, else compiles the kernel "
        f"privately, into {private_folder()}. {LOCK_TIMEOUT_ENV} sets how long to wait (seconds)."
    )


_CACHES: weakref.WeakSet[KernelCache] = weakref.WeakSet()


class KernelCache:
    """Kernels in memory (one dict for interpreted modules, one for compiled ones)
    backed by the disk cache."""

    def __init__(self) -> None:
        self._memory: dict[bool, dict[str, LoadedKernel]] = {False: {}, True: {}}
        self._new_locks()
        _CACHES.add(self)

    def _new_locks(self) -> None:
        """Make the locks (also in a forked child, whose copies may be held by threads it lacks)."""
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

    def clear_memory(self) -> None:
        for d in self._memory.values():
            d.clear()

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def get(self, module: ModuleOp, spec: KernelSpec) -> LoadedKernel:
        """The kernel for `module` (the variant's IR) and `spec`: from memory, else from
        disk, else compiled (`compile_module(module, sm=..., seq_len=bucket)`, plus
        `direction=` and `wrt=` for a backward kernel) and written to disk first. One
        thread per key, and one process per key and cache folder, looks it up at a time;
        a process that waited `$ATTNFUSE_LOCK_TIMEOUT` seconds for another goes on without
        the lock (see the module docstring)."""
        key = spec.key()
        memory = self._memory[spec.interpret]
        if (k := memory.get(key)) is not None:
            return k
        if spec.interpret:
            require_interpretable_numpy()
        with self._key_lock(key):
            if (k := memory.get(key)) is not None:
                return k
            folder = kernel_folder()
            with file_lock(folder / f"{key}.lock") as holder:
                if holder is not None:
                    _warn_stalled(folder / f"{key}.lock", holder)
                kernel = self._load(folder / f"{key}.py", key, spec.interpret)
                if kernel is None:
                    kernel = self._compile(module, spec, key, folder if holder is None else private_folder())
                else:
                    _STATS["disk_loads"] += 1
            if kernel.from_disk:
                _dump_cached(module, spec)
            memory[key] = kernel
            return kernel

    @staticmethod
    def _compile(module: ModuleOp, spec: KernelSpec, key: str, folder: Path) -> LoadedKernel:
        """Compile, write the cache file (in the fallback folder if writing fails) and
        import it."""
        compiled = _compile_fn()(module.clone(), sm=spec.sm, seq_len=spec.seq_bucket, **spec.compile_options())
        source = compiled.source if compiled.source.endswith("\n") else compiled.source + "\n"
        text = entry_text(key, source, compiled.launch_params)
        path = _write_entry(folder, key, text, spec.ir)
        _STATS["compiles"] += 1
        params = _split_source(text, key)[1]
        return LoadedKernel(key, path, source, params, load_module(path, interpret=spec.interpret), spec.interpret)

    @staticmethod
    def _load(path: Path, key: str, interpret: bool) -> LoadedKernel | None:
        """A kernel from its cache file; None, with a warning saying why, when the file
        is missing, untrusted, damaged or fails to import (it is then compiled again)."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        try:  # each refusal is a ValueError whose text completes "it ..."
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("is not a regular file")
            if reason := untrusted(st):
                raise ValueError(reason)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"cannot be read ({e})") from e
            source, params = _split_source(text, key)
            try:
                module = load_module(path, interpret=interpret)
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # a cache file must not end the process (SystemExit)
                raise ValueError(f"raised {e!r} when imported") from e
        except ValueError as e:
            _warn(f"AttnFuse ignores the cached kernel {path}: it {e}; the kernel is compiled again")
            return None
        return LoadedKernel(key, path, source, params, module, interpret, from_disk=True)

    def evict(self, kernel: LoadedKernel) -> None:
        """Forget `kernel` in memory and delete its cache file."""
        memory = self._memory[kernel.interpret]
        with self._key_lock(kernel.key):
            if memory.get(kernel.key) is kernel:
                del memory[kernel.key]
            with contextlib.suppress(OSError):
                kernel.path.unlink()

    def launcher(self, module: ModuleOp, spec: KernelSpec) -> tuple[LoadedKernel, Callable[..., Any]]:
        """The kernel (as `get`) and the function that launches it. A kernel read from
        disk is trusted after its first launch: if that raises (anything but
        `KeyboardInterrupt`), its file is evicted, the kernel compiled again and launched
        once more; a second failure propagates."""
        kernel = self.get(module, spec)
        if not kernel.from_disk:
            return kernel, kernel.launch
        launch, checked = kernel.launch, False

        def first_launch_checked(*args: Any, **kwargs: Any) -> Any:
            nonlocal launch, checked
            if checked:
                return launch(*args, **kwargs)
            try:
                result = launch(*args, **kwargs)
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                _warn(f"AttnFuse evicts the cached kernel {kernel.path}: its first launch raised {e!r}")
                self.evict(kernel)
                launch = self.get(module, spec).launch
                result = launch(*args, **kwargs)
            checked = True
            return result

        return kernel, first_launch_checked


KERNELS = KernelCache()
"""The process-wide kernel cache."""


def stats() -> dict[str, int]:
    """Kernel compilations and disk loads so far in this process."""
    return dict(_STATS)


def _after_fork_in_child() -> None:
    """Make the cache's locks anew in a forked child (see `attnfuse.cache_loader`)."""
    for kernels in list(_CACHES):
        kernels._new_locks()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
