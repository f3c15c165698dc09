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
IR, for people; `<key>.lock` is the entry's lock file.

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
wait and then load its file (`torchrun` ranks starting cold). Interpreted launches are
serialised (`interpreter_library`): Triton's interpreter patches `triton.language`
globally while a kernel runs.

`triton.jit` reads its function's source, so generated code is imported from that
real file (`importlib`). Whether `triton.jit` builds an interpreted function is
decided when the module runs its decorators: modules are imported with
`TRITON_INTERPRET` set to 1 (interpreted) or 0 (compiled), and the two kinds are
cached apart.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from xdsl.dialects.builtin import ModuleOp

import attnfuse

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


def cache_dir() -> Path:
    """Where kernels live: `$ATTNFUSE_CACHE_DIR`, default `~/.cache/attnfuse`."""
    return Path(os.environ.get("ATTNFUSE_CACHE_DIR") or Path.home() / ".cache" / "attnfuse")


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


DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True)
class KernelSpec:
    """Everything a kernel's key covers, besides versions. `direction` is "fwd" (the
    forward: out and lse) or "bwd" (the backward); `wrt` are the indices of the function
    arguments a backward kernel differentiates (0, 1, 2 for q, k, v, 3... for the extra
    tensors, in order), empty for a forward."""

    ir: str
    dtypes: tuple[str, str, str]
    heads: tuple[int, int]
    head_dims: tuple[int, int]
    seq_bucket: int
    sm: int
    interpret: bool
    direction: str = "fwd"
    wrt: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"a kernel's direction is 'fwd' or 'bwd', got {self.direction!r}")
        if self.direction == "fwd" and self.wrt:
            raise ValueError(f"a forward kernel differentiates nothing, got wrt={self.wrt}")
        if self.direction == "bwd" and (not self.wrt or list(self.wrt) != sorted(set(self.wrt))):
            raise ValueError(f"a backward kernel needs wrt: increasing argument indices, got {self.wrt}")

    def compile_options(self) -> dict[str, Any]:
        """The keywords the compile function gets besides `sm` and `seq_len`: none for a
        forward, `direction` and `wrt` for a backward."""
        return {} if self.direction == "fwd" else {"direction": self.direction, "wrt": self.wrt}

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


_import_lock = threading.Lock()


def load_module(path: str | Path, *, interpret: bool, name: str | None = None) -> ModuleType:
    """Import the generated Python file at `path` as a fresh module, with
    `TRITON_INTERPRET` set for its `@triton.jit` decorators (1 when `interpret`)."""
    path = Path(path)
    name = name or f"attnfuse_kernels.{'interp' if interpret else 'cuda'}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import generated kernel {path}")
    with _import_lock:
        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
        try:
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        finally:
            if old is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = old
    if not callable(getattr(module, "launch", None)):
        raise RuntimeError(f"generated kernel {path} defines no launch(...) function")
    return module


_SOURCES: dict[tuple[str, bool], ModuleType] = {}


def load_source(source: str, folder: str | Path, *, interpret: bool) -> ModuleType:
    """Import generated `source` outside the kernel cache (tests, benchmarks): it is
    written to `folder/attnfuse_<hash of the text>.py`, since `triton.jit` reads its
    functions' source file, then imported with `load_module`; once per text and mode in a
    process."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    module = _SOURCES.get((digest, interpret))
    if module is None:
        path = Path(folder) / f"attnfuse_{digest}.py"
        path.write_text(source, encoding="utf-8")
        module = _SOURCES[(digest, interpret)] = load_module(path, interpret=interpret)
    return module


_library_lock = threading.RLock()
_library_swaps: list[tuple[Any, str, Any, Any]] | None = None
_namespaces: list[Any] | None = None


def _language_namespaces() -> list[Any]:
    """The namespaces whose attributes Triton's interpreter and `interpreter_library`
    replace: the `triton.language` modules loaded when first asked, and the classes
    `tl.tensor`, `tl.dtype` and `tl.core.tensor_descriptor_base`. Found once per process
    (under `_library_lock`): other threads import modules meanwhile, and a walk over
    `sys.modules` on every launch could see it change."""
    global _namespaces
    if _namespaces is None:
        import triton.language as tl

        with contextlib.suppress(ImportError):
            # Gluon checks, when first imported, that the library functions are compiled ones.
            import triton.experimental.gluon  # noqa: F401
        modules = [m for n, m in sys.modules.copy().items() if n.split(".")[:2] == ["triton", "language"]]
        _namespaces = [*modules, tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base]
    return _namespaces


def _compiled_library_functions() -> list[tuple[Any, str, Any, Any]]:
    """(owner, attribute, compiled function, interpreted twin) for every compiled
    `@triton.jit` function of Triton's library; found once per process. Call it under
    `_library_lock` only (`interpreter_library`): while another thread's launch has
    swapped them, a search would find only the twins."""
    global _library_swaps
    if _library_swaps is None:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        twins: dict[int, Any] = {}
        _library_swaps = [
            (o, a, f, twins.setdefault(id(f), InterpretedFunction(f.fn)))
            for o in _language_namespaces()
            for a, f in vars(o).copy().items()
            if isinstance(f, JITFunction)
        ]
    return _library_swaps


def _restore_namespaces(saved: list[tuple[Any, dict[str, Any]]]) -> None:
    """Put back every attribute of the saved namespaces that was replaced since, and remove
    those added to a class. Names added to a module stay: a newly imported submodule, and
    the `interpreter_semantic` the interpreter gives the modules of the functions it has
    rewritten, which those rewritten functions keep using."""
    for owner, before in saved:
        for name, value in vars(owner).copy().items():
            if name not in before:
                if isinstance(owner, type):
                    delattr(owner, name)
            elif before[name] is not value:
                setattr(owner, name, before[name])


@contextlib.contextmanager
def interpreter_library() -> Iterator[None]:
    """Let interpreted kernels call Triton's own library functions, and leave
    `triton.language` as it was found.

    `tl.max`, `tl.sum`, `tl.cdiv`... are themselves `@triton.jit` functions, compiled
    or interpreted as `TRITON_INTERPRET` said when `triton.language` was first
    imported, and an interpreted kernel cannot call a compiled one. Inside this block
    every compiled library function (attributes of the `triton.language` modules and
    of `tl.tensor`) is replaced by an interpreted twin.

    On exit every attribute of the language's namespaces is put back as it was on
    entry. Triton 3.6's interpreter undoes its own patches of `triton.language` after a
    kernel, but not those it makes when an interpreted kernel calls a library function
    such as `tl.max`: `triton.language.core`'s builtins would stay bound to the
    interpreter, and any later compilation in the process (a Triton or Gluon kernel for
    a GPU) would fail in its front end.

    The block holds a process-wide lock, so interpreted launches run one at a time: the
    interpreter itself patches `triton.language` while a kernel runs."""
    with _library_lock:
        swaps = _compiled_library_functions()
        saved = [(owner, vars(owner).copy()) for owner in _language_namespaces()]
        for owner, attr, _, twin in swaps:
            setattr(owner, attr, twin)
        try:
            yield
        finally:
            _restore_namespaces(saved)


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


# --------------------------------------------------------------------------- the folder


def _untrusted(st: os.stat_result) -> str | None:
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
    if reason := _untrusted(st):
        return reason
    if not os.access(folder, os.W_OK | os.X_OK):
        return "is not writable"
    return None


_fallback: Path | None = None
_fallback_lock = threading.Lock()
_warned: set[str] = set()


def _fall_back(configured: Path, reason: str) -> Path:
    """The private temporary kernel folder of this process (created once, removed at
    exit), after one warning per unusable configured folder."""
    global _fallback
    with _fallback_lock:
        if _fallback is None:
            root = tempfile.mkdtemp(prefix="attnfuse-cache-")
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            _fallback = Path(root) / "kernels"
            _fallback.mkdir(mode=0o700)
        if str(configured) not in _warned:
            _warned.add(str(configured))
            warnings.warn(
                f"AttnFuse cannot use the kernel cache folder {configured}: {reason}. Kernels are cached in "
                f"{_fallback.parent} for this process only; set ATTNFUSE_CACHE_DIR to a folder of yours that "
                f"only you can write to.",
                RuntimeWarning,
                stacklevel=2,
            )
        return _fallback


def kernel_folder() -> Path:
    """The folder kernel files go to: `cache_dir()/kernels` when both folders are usable
    (see the module docstring), else this process's private temporary folder."""
    configured = cache_dir()
    for folder in (configured, configured / "kernels"):
        if reason := _unusable(folder):
            return _fall_back(configured, f"{folder} {reason}")
    return configured / "kernels"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created with mode 0600) inside the block.
    Where the lock file cannot be opened (or there is no `fcntl`), the block runs
    unlocked: atomic writes keep the cache valid, only the work may be repeated."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except (ImportError, OSError):  # no fcntl (not POSIX), or no lock file
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


_STATS = {"compiles": 0, "disk_loads": 0}


class KernelCache:
    """Kernels in memory (one dict for interpreted modules, one for compiled ones)
    backed by the disk cache."""

    def __init__(self) -> None:
        self._memory: dict[bool, dict[str, LoadedKernel]] = {False: {}, True: {}}
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
        thread per key, and one process per key and cache folder, looks it up at a time."""
        key = spec.key()
        memory = self._memory[spec.interpret]
        if (k := memory.get(key)) is not None:
            return k
        with self._key_lock(key):
            if (k := memory.get(key)) is not None:
                return k
            folder = kernel_folder()
            with _file_lock(folder / f"{key}.lock"):
                kernel = self._load(folder / f"{key}.py", key, spec.interpret)
                if kernel is not None:
                    _STATS["disk_loads"] += 1
                else:
                    kernel = self._compile(module, spec, key, folder)
            memory[key] = kernel
            return kernel

    @staticmethod
    def _compile(module: ModuleOp, spec: KernelSpec, key: str, folder: Path) -> LoadedKernel:
        """Compile, write the cache file (in the fallback folder if writing fails) and
        import it."""
        compiled = _compile_fn()(module.clone(), sm=spec.sm, seq_len=spec.seq_bucket, **spec.compile_options())
        source = compiled.source if compiled.source.endswith("\n") else compiled.source + "\n"
        text = entry_text(key, source, compiled.launch_params)
        try:
            _write_atomic(folder / f"{key}.py", text)
        except OSError as e:
            folder = _fall_back(cache_dir(), f"{folder / f'{key}.py'} cannot be written ({e})")
            _write_atomic(folder / f"{key}.py", text)
        with contextlib.suppress(OSError):
            _write_atomic(folder / f"{key}.mlir", spec.ir)
        _STATS["compiles"] += 1
        params = _split_source(text, key)[1]
        path = folder / f"{key}.py"
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
            if reason := _untrusted(st):
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
