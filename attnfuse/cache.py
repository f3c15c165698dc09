"""The kernel cache: generated Triton modules, on disk and in memory.

A kernel is identified by a key, the sha256 of: the variant's canonical IR text, the
q/k/v dtypes, head counts and head dims, the sequence-length bucket, the SM version
(compute capability, 0 under the interpreter), whether it runs interpreted, the
Triton version and the AttnFuse version (plus a fingerprint of AttnFuse's sources,
so that a changed compiler never serves a stale kernel).

On disk (`$ATTNFUSE_CACHE_DIR`, default `~/.cache/attnfuse`), a kernel is one Python
file `kernels/<key>.py`: the generated source, then a last comment line carrying the
launch parameters as JSON. It is written to a temporary file in the same folder and
renamed into place (`os.replace`), so readers never see a partial file and two
processes compiling the same kernel both succeed, leaving one valid file. A
`<key>.mlir` beside it holds the IR, for people.

`triton.jit` reads its function's source, so generated code is imported from that
real file (`importlib`). Whether `triton.jit` builds an interpreted function is
decided when the module runs its decorators: modules are imported with
`TRITON_INTERPRET` set to 1 (interpreted) or 0 (compiled), and the two kinds are
cached apart.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from xdsl.dialects.builtin import ModuleOp

import attnfuse

_PARAMS_MARK = "# attnfuse-launch-params: "

CompileFn = Callable[..., Any]
"""`compile_module(module, *, sm, seq_len)` returning an object with `.source` (Python
text defining `launch(*tensors) -> (out, lse)`) and `.launch_params` (a dict)."""

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


@dataclass(frozen=True)
class KernelSpec:
    """Everything a kernel's key covers, besides versions."""

    ir: str
    dtypes: tuple[str, str, str]
    heads: tuple[int, int]
    head_dims: tuple[int, int]
    seq_bucket: int
    sm: int
    interpret: bool

    def key(self) -> str:
        fields = {
            "ir": self.ir,
            "dtypes": list(self.dtypes),
            "heads": list(self.heads),
            "head_dims": list(self.head_dims),
            "seq_bucket": self.seq_bucket,
            "sm": self.sm,
            "interpret": self.interpret,
            "triton": triton_version(),
            "attnfuse": version_fingerprint(),
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class LoadedKernel:
    """A generated module, imported: `launch(q, k, v, *extras) -> (out, lse)`."""

    key: str
    path: Path
    source: str
    launch_params: dict[str, Any]
    module: ModuleType
    interpret: bool

    @property
    def launch(self) -> Callable[..., Any]:
        launch = self.module.launch
        if not self.interpret or not _compiled_library_functions():
            return launch

        def interpreted(*args: Any) -> Any:
            with interpreter_library():
                return launch(*args)

        return interpreted


def seq_bucket(nq: int, nk: int) -> int:
    """The sequence-length bucket: the next power of two of max(Nq, Nk), at least 128."""
    n = max(nq, nk)
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


def _compiled_library_functions() -> list[tuple[Any, str, Any, Any]]:
    """(owner, attribute, compiled function, interpreted twin) for every compiled
    `@triton.jit` function of Triton's library; found once per process."""
    global _library_swaps
    if _library_swaps is None:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        with contextlib.suppress(ImportError):
            # Gluon checks, when first imported, that the library functions are compiled ones.
            import triton.experimental.gluon  # noqa: F401
        owners: list[Any] = [m for n, m in list(sys.modules.items()) if n.split(".")[:2] == ["triton", "language"]]
        owners.append(tl.core.tensor)
        twins: dict[int, Any] = {}
        _library_swaps = [
            (o, a, f, twins.setdefault(id(f), InterpretedFunction(f.fn)))
            for o in owners
            for a, f in list(vars(o).items())
            if isinstance(f, JITFunction)
        ]
    return _library_swaps


@contextlib.contextmanager
def interpreter_library() -> Iterator[None]:
    """Let interpreted kernels call Triton's own library functions.

    `tl.max`, `tl.sum`, `tl.cdiv`... are themselves `@triton.jit` functions, compiled
    or interpreted as `TRITON_INTERPRET` said when `triton.language` was first
    imported, and an interpreted kernel cannot call a compiled one. Inside this block
    every compiled library function (attributes of the `triton.language` modules and
    of `tl.tensor`) is replaced by an interpreted twin; on exit the originals come
    back. A process started with TRITON_INTERPRET=1 has nothing to replace."""
    with _library_lock:
        swaps = _compiled_library_functions()
        for owner, attr, _, twin in swaps:
            setattr(owner, attr, twin)
        try:
            yield
        finally:
            for owner, attr, fn, _ in swaps:
                setattr(owner, attr, fn)


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


def _split_source(text: str) -> tuple[str, dict[str, Any]]:
    """The generated source and launch parameters of a cache file."""
    body, _, last = text.rstrip("\n").rpartition("\n")
    if not last.startswith(_PARAMS_MARK):
        raise ValueError("the cache file has no launch-parameters line")
    return body + "\n", json.loads(last[len(_PARAMS_MARK) :])


_STATS = {"compiles": 0, "disk_loads": 0}


class KernelCache:
    """Kernels in memory (one dict for interpreted modules, one for compiled ones)
    backed by the disk cache."""

    def __init__(self) -> None:
        self._memory: dict[bool, dict[str, LoadedKernel]] = {False: {}, True: {}}
        self._lock = threading.Lock()

    def clear_memory(self) -> None:
        for d in self._memory.values():
            d.clear()

    def get(self, module: ModuleOp, spec: KernelSpec) -> LoadedKernel:
        """The kernel for `module` (the variant's IR) and `spec`: from memory, else from
        disk, else compiled (`compile_module(module, sm=..., seq_len=bucket)`) and
        written to disk first."""
        key = spec.key()
        memory = self._memory[spec.interpret]
        if (k := memory.get(key)) is not None:
            return k
        with self._lock:
            if (k := memory.get(key)) is not None:
                return k
            folder = cache_dir() / "kernels"
            path = folder / f"{key}.py"
            kernel = None
            if path.exists():
                kernel = self._load(path, key, spec.interpret)
                if kernel is not None:
                    _STATS["disk_loads"] += 1
            if kernel is None:
                compiled = _compile_fn()(module.clone(), sm=spec.sm, seq_len=spec.seq_bucket)
                source = compiled.source if compiled.source.endswith("\n") else compiled.source + "\n"
                params = json.dumps(_jsonable(compiled.launch_params), sort_keys=True)
                folder.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):
                    _write_atomic(folder / f"{key}.mlir", spec.ir)
                _write_atomic(path, f"{source}{_PARAMS_MARK}{params}\n")
                _STATS["compiles"] += 1
                module_ = load_module(path, interpret=spec.interpret)
                kernel = LoadedKernel(key, path, source, json.loads(params), module_, spec.interpret)
            memory[key] = kernel
            return kernel

    @staticmethod
    def _load(path: Path, key: str, interpret: bool) -> LoadedKernel | None:
        """A kernel from its cache file; None when the file is unreadable or broken
        (it is then recompiled and overwritten)."""
        try:
            source, params = _split_source(path.read_text(encoding="utf-8"))
            module = load_module(path, interpret=interpret)
        except Exception:
            return None
        return LoadedKernel(key, path, source, params, module, interpret)


KERNELS = KernelCache()
"""The process-wide kernel cache."""


def stats() -> dict[str, int]:
    """Kernel compilations and disk loads so far in this process."""
    return dict(_STATS)
