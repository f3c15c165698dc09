"""The loader of generated modules: `load_module` imports a generated Triton file with
`TRITON_INTERPRET` set for its `@triton.jit` decorators, `load_source` imports source text
outside the kernel cache, and `interpreter_library` lets interpreted kernels call
Triton's own library functions (see `attnfuse.cache`, which uses them and re-exports them).
`require_interpretable_numpy` refuses a numpy that Triton's interpreter cannot run with.

Both hold process-wide locks: `load_module` while it sets `TRITON_INTERPRET` and imports,
`interpreter_library` while an interpreted kernel runs (Triton's interpreter patches
`triton.language` globally). A process forked while another thread holds one would
inherit it held, by a thread that does not exist in the child, and its first interpreted
call would never return: in the child (`os.register_at_fork`) the locks are made anew,
and what the holder had changed (`TRITON_INTERPRET`, the library's namespaces) is put back
as it was before the holder took the lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

_MISSING = object()
_import_env: object = _MISSING
"""While `load_module` holds `_import_lock`: `TRITON_INTERPRET`'s value before it set it
(None: unset); else `_MISSING`."""
_entry_state: list[tuple[Any, dict[str, Any]]] | None = None
"""While a thread is inside the outermost `interpreter_library` block: the namespaces as
they were on entry; else None."""

_import_lock = threading.Lock()


def load_module(path: str | Path, *, interpret: bool, name: str | None = None) -> ModuleType:
    """Import the generated Python file at `path` as a fresh module, with
    `TRITON_INTERPRET` set for its `@triton.jit` decorators (1 when `interpret`)."""
    path = Path(path)
    name = name or f"attnfuse_kernels.{'interp' if interpret else 'cuda'}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import generated kernel {path}")
    if interpret:
        _drop_dead_overflow_checks()
    global _import_env
    with _import_lock:
        old = _import_env = os.environ.get("TRITON_INTERPRET")
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
            _import_env = _MISSING
            _set_triton_interpret(old)
    if not callable(getattr(module, "launch", None)):
        raise RuntimeError(f"generated kernel {path} defines no launch(...) function")
    return module


def _drop_dead_overflow_checks() -> None:
    """Triton's interpreter builds an int32 overflow check around every integer add, sub and
    mul of a kernel (both operands cast to int64, the operation again, two comparisons) and
    then drops it: its assert is emitted only with `debug`, which the interpreter's options
    leave off. That arithmetic is a quarter to a third of an interpreted kernel's time; with the
    check's option off too, the interpreter skips it, and nothing a kernel computes or checks
    changes. Left alone where the assert would run (debug on) or Triton's interpreter differs."""
    try:
        from triton.runtime import interpreter

        options = interpreter.interpreter_builder.options
        if options.sanitize_overflow and not options.debug:
            interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
    except (ImportError, AttributeError, TypeError):
        pass


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


def require_interpretable_numpy() -> None:
    """Refuse, with the versions, a numpy that Triton's interpreter cannot run with: up to Triton
    3.6 it converts one-element arrays to Python scalars in a way numpy 2.4 rejects, so every
    interpreted kernel would fail inside the interpreter with a TypeError."""
    import numpy
    import triton

    from attnfuse.errors import AttnFuseError

    def release(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())

    if release(numpy.__version__) >= (2, 4) and release(triton.__version__) <= (3, 6):
        raise AttnFuseError(
            f"the interpret backend runs Triton {triton.__version__}'s interpreter, which needs numpy < 2.4, "
            f"and this process has numpy {numpy.__version__}: install 'numpy<2.4' (as AttnFuse's own "
            "requirements say), or run on CUDA tensors"
        )


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
    global _entry_state
    with _library_lock:
        swaps = _compiled_library_functions()
        saved = [(owner, vars(owner).copy()) for owner in _language_namespaces()]
        outermost = _entry_state is None
        if outermost:
            _entry_state = saved
        for owner, attr, _, twin in swaps:
            setattr(owner, attr, twin)
        try:
            yield
        finally:
            _restore_namespaces(saved)
            if outermost:
                _entry_state = None


def _set_triton_interpret(value: str | None) -> None:
    if value is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = value


def _after_fork_in_child() -> None:
    """Make the locks anew in a forked child, and undo what a thread of the parent holding
    one had changed: the child has no such thread to release them or put things back."""
    global _import_lock, _library_lock, _import_env, _entry_state
    _import_lock, _library_lock = threading.Lock(), threading.RLock()
    if _import_env is not _MISSING:
        _set_triton_interpret(_import_env)  # type: ignore[arg-type]
        _import_env = _MISSING
    if _entry_state is not None:
        _restore_namespaces(_entry_state)
        _entry_state = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
