"""The runtime: variants that trace once per signature, validate their inputs, and
dispatch to a backend through the kernel cache.

Backends:

- `triton`: the generated Triton kernel on CUDA tensors;
- `interpret`: the same generated code under the Triton interpreter (on CPU). bfloat16
  calls run the float32 kernel (inputs cast up, the output back down): Triton 3.6's
  interpreter multiplies bfloat16 bit patterns in `tl.dot`;
- `reference`: the eager PyTorch executor of the attn IR (`attnfuse.reference`),
  computing in float32 and returning q's dtype;
- `auto` (the default): `triton` for CUDA tensors, `reference` for CPU tensors.

Every backend is differentiable. `reference` is plain PyTorch autograd over the eager
executor. On `triton` and `interpret`, a call that needs a gradient (grad mode on and an
input requiring grad) is recorded by `attnfuse.autograd` (eagerly through an autograd
Function, the twin of the `attnfuse::attention` custom op that torch.compile traces): it
saves q, k, v, the extra tensors, out and lse, and its backward
launches a backward kernel the compiler derives from the variant's IR, for exactly the
inputs that require grad (compiled and cached per set of inputs, on the first such call;
a gradient the compiler cannot form, such as one with respect to ALiBi slopes, is an
`AttnFuseError` there). bfloat16 on the interpreter runs the float32 backward kernel.
Double backward is an `AttnFuseError`. Calls needing no gradient launch the forward
kernel directly. While the compile function in effect builds
no backward (one without a `direction` parameter, see `cache.CompileFn`), a call needing a
gradient is refused with an `AttnFuseError` rather than return a detached output.

Under `torch.compile`, a variant call becomes one `attnfuse::attention` node (on every
backend), so `fullgraph=True` traces it, forward and backward, with no graph break. The
kernel is found per call from the tensors, as in eager mode; the backend is the one in
effect when the call was traced (torch.compile does not see `af.backend`: a compiled call
run under a backend of another kind is an `AttnFuseError`; `torch.compiler.reset()`
traces again).

Degenerate shapes behave the same on every backend: no keys (Nk = 0) give zeros (lse
-inf, or the sink's logit), no queries (Nq = 0) or B = 0 an empty output; zero heads
or a zero head dim is an `AttnFuseError` naming the tensor.

The backend comes from `with af.backend(name):` (per thread and task: a context
variable), else from the `ATTNFUSE_BACKEND` environment variable, else `auto`.

A call whose signature was seen before (the hot path) does no tracing, IR work or
file I/O: it builds a tuple from tensor attributes, looks it up in the variant's
dict, checks the few relations the tuple cannot hold (batch sizes, kv lengths,
devices, extra tensors' sizes) and launches.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
from xdsl.utils.exceptions import DiagnosticException

from attnfuse import autograd, cache, dsl, validation
from attnfuse.cache import KERNELS, KernelSpec, LoadedKernel, seq_bucket, use_compiler
from attnfuse.errors import AttnFuseError

__all__ = [
    "BACKENDS",
    "Kernel",
    "Variant",
    "backend",
    "clear_caches",
    "current_backend",
    "device_sm",
    "stats",
    "use_compiler",
    "variant",
]

BACKENDS = ("auto", "triton", "interpret", "reference")

_backend_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("attnfuse_backend", default=None)


def _check_backend(name: object, source: str) -> str:
    if name not in BACKENDS:
        raise AttnFuseError(f"{source} {name!r} is not a backend; expected one of {', '.join(BACKENDS)}")
    return name  # type: ignore[return-value]


@contextlib.contextmanager
def backend(name: str) -> Iterator[None]:
    """Run variants inside the block on backend `name` (auto, triton, interpret or
    reference)."""
    token = _backend_var.set(_check_backend(name, "af.backend"))
    try:
        yield
    finally:
        _backend_var.reset(token)


# os.environ.get costs about a microsecond (the key is encoded on every call); the hot path
# reads the variable from os.environ's own mapping with the key encoded once, so changes made
# through os.environ (and pytest's monkeypatch) are still seen.
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("ATTNFUSE_BACKEND") if hasattr(os.environ, "encodekey") else None  # type: ignore[attr-defined]


def _env_backend() -> str | None:
    """$ATTNFUSE_BACKEND, or None when unset."""
    if _ENV_DATA is None or _ENV_KEY is None:
        return os.environ.get("ATTNFUSE_BACKEND")
    raw = _ENV_DATA.get(_ENV_KEY)
    return None if raw is None else os.environ.decodevalue(raw)  # type: ignore[attr-defined]


def current_backend() -> str:
    """The backend name in effect: af.backend(...), else $ATTNFUSE_BACKEND, else auto."""
    name = _backend_var.get()
    if name is not None:
        return name
    env = os.environ.get("ATTNFUSE_BACKEND")
    return _check_backend(env, "ATTNFUSE_BACKEND=") if env else "auto"


_STATS = {"traces": 0}
_VARIANTS: weakref.WeakSet[Variant] = weakref.WeakSet()


def stats() -> dict[str, int]:
    """Counters since the process started: `traces` (variant function traced into IR),
    `compiles` (kernels generated by the compiler), `disk_loads` (kernels imported
    from the disk cache without compiling)."""
    return {**_STATS, **cache.stats()}


def clear_caches() -> None:
    """Forget every traced IR, hot-path entry and in-memory kernel of this process (the
    disk cache stays)."""
    KERNELS.clear_memory()
    autograd.clear()
    _LSE_WORKSPACES.clear()
    for v in list(_VARIANTS):
        v._traces.clear()
        v._hot.clear()
        v._last = None


# --------------------------------------------------------------------------- kernels

_SM: dict[int, int] = {}


def device_sm(device: torch.device | str | int | None = None) -> int:
    """The SM version of a CUDA device (its compute capability as major * 10 + minor: 90
    for Hopper), the current one by default; 0 for a device that is not a CUDA GPU, or
    without CUDA (the interpreter's SM). Cached per device."""
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _SM:
        major, minor = torch.cuda.get_device_capability(index)
        _SM[index] = major * 10 + minor
    return _SM[index]


def _kernel_mode(backend_name: str, q: torch.Tensor) -> str:
    """The backend that runs for `backend_name` and these tensors."""
    if backend_name == "auto":
        return "triton" if q.device.type == "cuda" else "reference"
    if backend_name == "triton" and q.device.type != "cuda":
        raise AttnFuseError(
            f"backend 'triton' runs on CUDA tensors, but q is on {q.device}; use 'interpret' or "
            f"'reference' for CPU tensors"
        )
    return backend_name


def _load_kernel(
    trace: dsl.Trace, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, interpret: bool
) -> tuple[LoadedKernel, Callable[..., Any], KernelSpec]:
    """The kernel of `trace` for these tensors, its launch function (`KernelCache.launcher`)
    and its spec."""
    spec = KernelSpec(
        ir=trace.text,
        dtypes=(str(q.dtype), str(k.dtype), str(v.dtype)),
        heads=(q.shape[1], k.shape[1]),
        head_dims=(q.shape[3], v.shape[3]),
        seq_bucket=seq_bucket(q.shape[2], k.shape[2]),
        sm=0 if interpret else device_sm(q.device),
        interpret=interpret,
    )
    try:
        return (*KERNELS.launcher(trace.module, spec), spec)
    except DiagnosticException as e:
        name = trace.module.ops.first.sym_name.data  # type: ignore[union-attr]
        raise AttnFuseError(
            f"the Triton lowering cannot compile {name}: {e} (the reference backend runs every variant the attn "
            f"dialect can express)"
        ) from e


def _as_float32(x: object) -> object:
    """A bfloat16 tensor as a float32 copy; anything else as it is."""
    if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16:
        return x.float()
    return x


def _via_float32(launch: Callable[..., Any]) -> Callable[..., Any]:
    """`launch` of a float32 kernel, called with the tensors of a bfloat16 call: they are
    cast to float32, the output back to bfloat16 (lse stays float32)."""

    def run(*tensors: torch.Tensor, lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse_out = launch(*[_as_float32(t) for t in tensors], lse=lse)
        return out.to(torch.bfloat16), lse_out

    return run


_LSE_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def _lse_workspace(q: torch.Tensor) -> torch.Tensor:
    """A float32 buffer on q's device with room for a call's log-sum-exp ([B, Hq, Nq]), for
    calls that discard it (no backward): the kernel writes it there instead of into a new
    allocation (a few microseconds of host time per call). One per device, grown as needed
    and kept; concurrent calls may share it, since nothing reads it."""
    n = q.shape[0] * q.shape[1] * q.shape[2]
    ws = _LSE_WORKSPACES.get(q.device)
    if ws is None or ws.numel() < n:
        ws = _LSE_WORKSPACES[q.device] = torch.empty(max(n, 1 << 16), dtype=torch.float32, device=q.device)
    return ws


def _requires_grad(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


def _any_requires_grad(tensors: Sequence[object]) -> bool:
    return any(t.requires_grad for t in tensors)  # type: ignore[attr-defined]


def _needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors: Sequence[object]) -> bool:
    """Whether a call needs autograd: grad mode on and an input requiring grad."""
    return (
        q.requires_grad or k.requires_grad or v.requires_grad or any(_requires_grad(t) for t in tensors)
    ) and torch.is_grad_enabled()


def _differentiable(
    target: autograd.KernelTarget, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors: Sequence[object]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse), recorded by autograd (`autograd.eager_attention`). The backward kernel for
    the inputs requiring grad is compiled first, so that a gradient the compiler cannot
    form is an error here, not in the backward pass."""
    extras = cast(list[torch.Tensor], list(tensors))
    target.backward_launch(tuple(i for i, x in enumerate((q, k, v, *extras)) if x.requires_grad))
    return autograd.eager_attention(target, q, k, v, extras)


class Kernel:
    """A compiled variant for one signature (`Variant.compile`): the generated Triton
    `source`, its cache file `path`, its `launch_params`, and `__call__`. For bfloat16
    tensors on the interpreter it is the float32 kernel (see the module docstring)."""

    def __init__(
        self,
        variant: Variant,
        trace: dsl.Trace,
        loaded: LoadedKernel,
        launch: Callable[..., Any],
        signature: tuple[Any, ...],
        target: autograd.KernelTarget,
    ):
        self.variant = variant
        self.trace = trace
        self._loaded = loaded
        self._launch = launch
        self._signature = signature
        self._target = target

    @property
    def source(self) -> str:
        return self._loaded.source

    @property
    def path(self) -> str:
        return str(self._loaded.path)

    @property
    def launch_params(self) -> dict[str, Any]:
        return self._loaded.launch_params

    @property
    def launch(self) -> Callable[..., Any]:
        """The generated `launch(q, k, v, *extra tensors) -> (out, lse)`, called as is:
        no validation (benchmarks use it to time the kernel alone)."""
        return self._launch

    @property
    def interpreted(self) -> bool:
        return self._loaded.interpret

    def __repr__(self) -> str:
        mode = "interpret" if self.interpreted else "triton"
        return f"<attnfuse.Kernel {self.variant.__name__} ({mode}) at {self.path}>"

    def run_with_lse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *extras: object) -> Any:
        """(out [B, Hq, Nq, Dv] in q's dtype, natural-log lse float32 [B, Hq, Nq]);
        differentiable (with respect to out: lse is not) as a variant call is."""
        tensors = self.variant._validate_for(q, k, v, extras, self._signature, self.trace)
        if _needs_grad(q, k, v, tensors):
            return _differentiable(self._target, q, k, v, tensors)
        return self._launch(q, k, v, *tensors)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *extras: object) -> torch.Tensor:
        return self.run_with_lse(q, k, v, *extras)[0]


# --------------------------------------------------------------------------- variants


def _hot_key(
    backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extras: tuple[object, ...]
) -> tuple[Any, ...]:
    """The hot path's key of a call: the backend name, q's device, the q/k/v dtypes, head
    counts and head dims, the sequence-length bucket, and per extra argument its dtype and
    rank (a tensor) or its type and value (a constant). Raises (or gives an unhashable
    key) for arguments that are not rank-4 tensors: the caller then takes the slow path."""
    _, hq, nq, d = q.shape
    _, hkv, nk, dk = k.shape
    _, hv, _, dv = v.shape
    key = (backend_name, q.device, q.dtype, k.dtype, v.dtype, hq, hkv, hv, d, dk, dv, seq_bucket(nq, nk))
    if extras:
        key += tuple([(x.dtype, x.dim()) if isinstance(x, torch.Tensor) else (type(x), x) for x in extras])
    return key


class _Entry:
    """A hot-path entry: how to run one call signature (`run`), the relations to check
    first (`check`, None when there are none), the custom-op target of the signature
    (`target`) and how to pick the function's extra tensors out of the given extras
    (`select`, None when they are exactly those)."""

    __slots__ = ("run", "check", "target", "select")

    def __init__(
        self,
        run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, tuple[object, ...]], torch.Tensor],
        check: Callable[[torch.Tensor, torch.Tensor, Sequence[object]], bool] | None,
        target: autograd.OpTarget,
        select: Callable[[tuple[object, ...]], tuple[object, ...]] | None,
    ):
        self.run, self.check, self.target, self.select = run, check, target, select


class Variant:
    """An attention variant: a Python function of (q, k, v, *extras) built from the
    AttnFuse blocks, callable on tensors (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None):
        if not callable(fn):
            raise AttnFuseError(f"af.variant decorates a function, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.__name__ = name or getattr(fn, "__name__", "variant")
        if not self.__name__.isidentifier():
            self.__name__ = "variant"
        self._params = self._parameters(fn)
        self.arg_names = [p.name for p in self._params]
        self._traces: dict[tuple[Any, ...], dsl.Trace] = {}
        self._hot: dict[tuple[Any, ...], _Entry] = {}
        self._last: dsl.Trace | None = None
        self._handle = autograd.variant_handle(self)
        _VARIANTS.add(self)

    def _parameters(self, fn: Callable[..., Any]) -> list[inspect.Parameter]:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            raise AttnFuseError(f"cannot read the parameters of {fn!r}") from None
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if any(p.kind not in positional for p in params) or len(params) < 3:
            raise AttnFuseError(
                f"a variant function takes (q, k, v, *extras) as plain positional parameters, "
                f"got {self.__name__}{inspect.signature(fn)}"
            )
        return params

    def __repr__(self) -> str:
        return f"<attnfuse.Variant {self.__name__}({', '.join(self.arg_names)})>"

    # ---- the hot path

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *extras: object) -> torch.Tensor:
        """out = attention(q, k, v, *extras): [B, Hq, Nq, Dv] in q's dtype."""
        if _is_compiling():
            return autograd.site_call(self, q, k, v, extras)
        backend_name = _backend_var.get() or _env_backend() or "auto"
        try:  # `_entry`, inlined
            entry = self._hot[_hot_key(backend_name, q, k, v, extras)]
        except Exception:
            return self._prepare(backend_name, q, k, v, extras).run(q, k, v, extras)
        qs, ks, vs = q.shape, k.shape, v.shape
        if qs[0] != ks[0] or qs[0] != vs[0] or ks[2] != vs[2] or k.device != q.device or v.device != q.device:
            return self._prepare(backend_name, q, k, v, extras).run(q, k, v, extras)
        if entry.check is not None and not entry.check(q, k, extras):
            return self._prepare(backend_name, q, k, v, extras).run(q, k, v, extras)
        return entry.run(q, k, v, extras)

    def _entry(
        self, backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extras: tuple[object, ...]
    ) -> _Entry:
        """The hot-path entry of a call: found by its key when the relations it does not
        hold check out, else made by the slow path (`_prepare`)."""
        try:
            entry = self._hot[_hot_key(backend_name, q, k, v, extras)]
        except Exception:
            return self._prepare(backend_name, q, k, v, extras)
        qs, ks, vs = q.shape, k.shape, v.shape
        if qs[0] != ks[0] or qs[0] != vs[0] or ks[2] != vs[2] or k.device != q.device or v.device != q.device:
            return self._prepare(backend_name, q, k, v, extras)
        if entry.check is not None and not entry.check(q, k, extras):
            return self._prepare(backend_name, q, k, v, extras)
        return entry

    def _op_target(
        self, backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extras: tuple[object, ...]
    ) -> tuple[autograd.OpTarget, tuple[torch.Tensor, ...]]:
        """The custom-op target of a call (validated as `__call__` validates it) and the
        function's extra tensors: how a call traced by torch.compile runs."""
        entry = self._entry(backend_name, q, k, v, extras)
        tensors = extras if entry.select is None else entry.select(extras)
        return entry.target, cast(tuple[torch.Tensor, ...], tensors)

    # ---- the slow path: validation, tracing, kernel lookup

    def _bind(self, extras: Sequence[object]) -> tuple[object, ...]:
        """The extra arguments with defaults filled in."""
        params = self._params[3:]
        required = sum(p.default is inspect.Parameter.empty for p in params)
        if not required <= len(extras) <= len(params):
            names = ", ".join(self.arg_names)
            raise AttnFuseError(
                f"variant {self.__name__}({names}) takes {3 + required}"
                + (f" to {3 + len(params)}" if required < len(params) else "")
                + f" arguments, got {3 + len(extras)}"
            )
        return (*extras, *(p.default for p in params[len(extras) :]))

    def _signature(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, full: Sequence[object]) -> tuple[Any, ...]:
        head = (q.dtype, k.dtype, v.dtype, q.shape[1], k.shape[1], q.shape[3], v.shape[3])
        return head + tuple(
            ("tensor", x.dtype, x.dim()) if isinstance(x, torch.Tensor) else ("const", type(x), x) for x in full
        )

    def _trace(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, full: Sequence[object]) -> dsl.Trace:
        sig = self._signature(q, k, v, full)
        trace = self._traces.get(sig)
        if trace is None:
            args = [dsl.TensorArg.of(q), dsl.TensorArg.of(k), dsl.TensorArg.of(v)]
            args += [dsl.TensorArg.of(x) if isinstance(x, torch.Tensor) else x for x in full]
            trace = dsl.trace(self.fn, self.__name__, self.arg_names, args)
            _STATS["traces"] += 1
            self._traces[sig] = trace
        self._last = trace
        return trace

    def _validated_trace(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extras: Sequence[object]
    ) -> tuple[dsl.Trace, tuple[object, ...]]:
        validation.check_qkv(q, k, v)
        full = self._bind(extras)
        validation.check_extra_values(self.arg_names[3:], q, full)
        return self._trace(q, k, v, full), full

    def _prepare(
        self, backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extras: tuple[object, ...]
    ) -> _Entry:
        backend_name = _check_backend(backend_name, "af.backend" if _backend_var.get() else "ATTNFUSE_BACKEND=")
        trace, full = self._validated_trace(q, k, v, extras)
        validation.check_against_trace(trace, q, k, v, extras)
        select = self._selector(full, len(extras))
        mode = _kernel_mode(backend_name, q)
        if mode == "reference":
            from attnfuse.reference import run_reference

            cache.warn_reference_dumps_nothing()  # ATTNFUSE_DUMP_IR: the reference compiles nothing
            module = trace.module
            target: autograd.OpTarget = autograd.register(autograd.ReferenceTarget(trace))

            def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extras: tuple[object, ...]) -> torch.Tensor:
                tensors = cast(tuple[torch.Tensor, ...], extras if select is None else select(extras))
                return run_reference(module, q, k, v, *tensors, compute_dtype=torch.float32).to(q.dtype)

        else:
            if _needs_grad(q, k, v, full):  # before compiling anything
                names = [n for n, x in zip(self.arg_names, (q, k, v, *full), strict=True) if _requires_grad(x)]
                autograd.refuse_without_backward(mode == "interpret", names, self.__name__)
            _, launch, kernel_target = self._kernel(trace, q, k, v, full, interpret=mode == "interpret")
            target = kernel_target

            def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extras: tuple[object, ...]) -> torch.Tensor:
                tensors = extras if select is None else select(extras)
                if q.requires_grad or k.requires_grad or v.requires_grad or (tensors and _any_requires_grad(tensors)):
                    if torch.is_grad_enabled():
                        return _differentiable(kernel_target, q, k, v, tensors)[0]
                return launch(q, k, v, *tensors, lse=_lse_workspace(q))[0]

        check = validation.with_length_check(trace, validation.extras_check(trace, len(extras)))
        entry = _Entry(run, check, target, select)
        self._hot[_hot_key(backend_name, q, k, v, extras)] = entry
        return entry

    def _kernel(
        self,
        trace: dsl.Trace,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        full: Sequence[object],
        interpret: bool,
    ) -> tuple[LoadedKernel, Callable[..., Any], autograd.KernelTarget]:
        """The kernel of `trace` for these arguments, its launch function and its (registered)
        custom-op target; for bfloat16 on the interpreter, the float32 kernel, launched
        through `_via_float32`."""
        names = [*self.arg_names[:3], *(n for n, x in zip(self.arg_names[3:], full, strict=True) if _is_tensor(x))]
        if not (interpret and q.dtype == torch.bfloat16):
            loaded, launch, spec = _load_kernel(trace, q, k, v, interpret)
            target = autograd.KernelTarget(self.__name__, names, trace, spec, launch, float32=False)
            return loaded, launch, cast(autograd.KernelTarget, autograd.register(target))

        def meta(x: object) -> object:
            if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16:
                return torch.empty(x.shape, dtype=torch.float32, device="meta")
            return x

        fq, fk, fv = (meta(t) for t in (q, k, v))
        assert isinstance(fq, torch.Tensor) and isinstance(fk, torch.Tensor) and isinstance(fv, torch.Tensor)
        last, trace32 = self._last, self._trace(fq, fk, fv, [meta(x) for x in full])
        self._last = last
        loaded, launch, spec = _load_kernel(trace32, fq, fk, fv, interpret)
        launch = _via_float32(launch)
        target = autograd.KernelTarget(self.__name__, names, trace32, spec, launch, float32=True)
        return loaded, launch, cast(autograd.KernelTarget, autograd.register(target))

    @staticmethod
    def _selector(full: tuple[object, ...], n_given: int) -> Callable[[tuple[object, ...]], tuple[object, ...]] | None:
        """Picks the tensor arguments (the func's extra arguments) out of the given extras
        and the defaults; None when the given extras are exactly those."""
        tail = full[n_given:]
        positions = [i for i, x in enumerate(full) if isinstance(x, torch.Tensor)]
        if not tail and len(positions) == n_given:
            return None
        return lambda extras: tuple(((*extras, *tail))[i] for i in positions)

    def _validate_for(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        extras: tuple[object, ...],
        signature: tuple[Any, ...],
        trace: dsl.Trace,
    ) -> tuple[object, ...]:
        """Validate a call of a compiled `Kernel`; returns the tensors after q, k, v."""
        validation.check_qkv(q, k, v)
        full = self._bind(extras)
        validation.check_extra_values(self.arg_names[3:], q, full)
        got = self._signature(q, k, v, full)
        if got != signature:
            raise AttnFuseError(
                f"this kernel of {self.__name__} was compiled for {_describe_signature(signature)}, "
                f"got {_describe_signature(got)}; compile another with {self.__name__}.compile(...)"
            )
        validation.check_against_trace(trace, q, k, v, extras)
        return tuple(x for x in full if isinstance(x, torch.Tensor))

    # ---- public API

    def compile(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *extras: object) -> Kernel:
        """The generated kernel for this signature: Triton on CUDA tensors, the
        interpreter otherwise (or as af.backend says: 'triton' or 'interpret')."""
        name = current_backend()
        trace, full = self._validated_trace(q, k, v, extras)
        validation.check_against_trace(trace, q, k, v, extras)
        if name in ("auto", "reference"):
            interpret = q.device.type != "cuda"
        else:
            interpret = _kernel_mode(name, q) == "interpret"
        loaded, launch, target = self._kernel(trace, q, k, v, full, interpret)
        return Kernel(self, trace, loaded, launch, self._signature(q, k, v, full), target)

    def ir(self, *args: object) -> str:
        """The traced attn IR (canonical text): for example arguments `(q, k, v, ...)`
        when given (meta tensors will do), else of the latest call. A variant never
        called and taking only q, k, v is traced for fp16, 8 heads, head dim 64."""
        return self._trace_for(args, "ir").text

    def ir_module(self, *args: object) -> Any:
        """The traced IR as an xDSL `builtin.module` (a copy), as for `ir`."""
        return self._trace_for(args, "ir_module").module.clone()

    def _trace_for(self, args: Sequence[object], what: str) -> dsl.Trace:
        if args:
            if len(args) < 3:
                raise AttnFuseError(f"{self.__name__}.{what}(q, k, v, ...) needs at least q, k and v")
            q, k, v, *extras = args
            return self._validated_trace(q, k, v, extras)[0]  # type: ignore[arg-type]
        if self._last is not None:
            return self._last
        if any(p.default is inspect.Parameter.empty for p in self._params[3:]):
            raise AttnFuseError(
                f"{self.__name__} takes extra arguments ({', '.join(self.arg_names[3:])}): call it, or pass "
                f"example arguments to {what}(q, k, v, ...), before asking for its IR"
            )
        q = torch.empty(1, 8, 1, 64, dtype=torch.float16, device="meta")
        return self._validated_trace(q, q, q, ())[0]


def _is_tensor(x: object) -> bool:
    return isinstance(x, torch.Tensor)


_is_compiling = torch.compiler.is_compiling


def _describe_signature(sig: tuple[Any, ...]) -> str:
    dq, dk, dv, hq, hkv, d, dvd = sig[:7]
    text = f"q/k/v {dq}/{dk}/{dv}, {hq}/{hkv} heads, head dims {d}/{dvd}"
    extras = [f"{x[1]} {x[2]}-d" if x[0] == "tensor" else repr(x[2]) for x in sig[7:]]
    return text + (f", extras ({', '.join(extras)})" if extras else "")


def variant(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator turning a function of (q, k, v, *extras) built from AttnFuse blocks
    into a callable `Variant`; also usable as `@af.variant(name="...")`."""
    if fn is None:
        return lambda f: Variant(f, name)
    return Variant(fn, name)
