"""Differentiable variant calls: two `torch.library` custom ops that autograd and
`torch.compile` see, and the registry their string keys name.

- `attnfuse::attention(key, q, k, v, extras) -> (out, lse)`: the forward. `extras` are
  the variant's extra tensor arguments (the traced function's arguments after q, k, v,
  in order; constants are baked into the IR). `out` is [B, Hq, Nq, Dv] in q's dtype,
  `lse` the float32 natural-log log-sum-exp [B, Hq, Nq].
- `attnfuse::attention_backward(key, wrt, q, k, v, extras, out, lse, dout) -> grads`: the
  gradients with respect to the arguments whose indices are in `wrt` (0, 1, 2 for q, k,
  v, 3... for the extra tensors), one per index, in that order.

Each has a fake implementation (`register_fake`: shapes and dtypes, nothing run), so
that `torch.compile(fullgraph=True)` traces a variant call into its graph, forward and
backward. The forward's autograd formula (`register_autograd`) saves q, k, v, the extra
tensors, out and lse (nothing when no gradient is needed: torch then skips it) and calls
the backward op for exactly the inputs that require grad, so a gradient nobody asked for
is neither computed nor compiled. lse is not differentiable. The backward op's own
formula raises `AttnFuseError`: double backward is not supported.

A key names an `OpTarget`, which runs the ops on real tensors:

- `KernelTarget`: one compiled forward kernel (a variant, a signature, the `triton` or
  `interpret` backend) and its backward kernels, compiled per `wrt` through the kernel
  cache (`direction="bwd"` is part of the key). bfloat16 on the interpreter runs the
  float32 kernels, as the forward does;
- `ReferenceTarget`: the reference executor; its backward runs autograd over it again;
- `SiteTarget`: a call site traced by torch.compile (a variant, the backend in effect
  when it was traced, and its constant arguments). It finds the kernel for the tensors
  of each call as an eager call does, so one compiled graph serves every sequence length.

The eager runtime records a call only when a gradient is needed (grad mode on and an
input requiring grad), through `attnfuse.eager.eager_attention`: a `torch.autograd.Function`
with the same target, saved tensors and backward as the ops, without their dispatch cost.
Other calls launch the kernel directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import operator
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

import torch
from xdsl.dialects.func import FuncOp
from xdsl.ir import BlockArgument, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse import dsl
from attnfuse.cache import KERNELS, KernelSpec, compiles_backward
from attnfuse.dialects import attn
from attnfuse.errors import AttnFuseError
from attnfuse.launch import current_backend, kernel_mode, reference_dtype
from attnfuse.reference import run_reference, run_reference_with_lse
from attnfuse.targets.triton.prelude import _empty_ordered, _heads_inner

__all__ = ["KernelTarget", "OpTarget", "ReferenceTarget", "attention", "recording", "site_call"]

Tensor = torch.Tensor


class VariantLike(Protocol):
    """What the targets need of a variant (`attnfuse.runtime.Variant`, the front end,
    which this module does not import): its name, its handle (`variant_handle`), the
    op target of a call and a validated trace."""

    __name__: str
    _handle: str

    def _op_target(
        self, backend_name: str, q: Tensor, k: Tensor, v: Tensor, extras: tuple[object, ...]
    ) -> tuple[OpTarget, tuple[Tensor, ...]]: ...

    def _validated_trace(
        self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[object]
    ) -> tuple[dsl.Trace, tuple[object, ...]]: ...


# --------------------------------------------------------------------------- targets


class OpTarget:
    """What a custom-op key names: how to run the forward and backward on real tensors,
    and the output layout for the fake implementation."""

    key: str

    def forward(self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(out, lse) as fresh tensors."""
        raise NotImplementedError

    def backward(
        self,
        wrt: Sequence[int],
        q: Tensor,
        k: Tensor,
        v: Tensor,
        extras: Sequence[Tensor],
        out: Tensor,
        lse: Tensor,
        dout: Tensor,
    ) -> list[Tensor]:
        """The gradients of the arguments in `wrt`, each in its argument's shape and dtype."""
        raise NotImplementedError

    def layout(self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]) -> Layout:
        """The output's layout for these (possibly fake) arguments."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the output's sizes come from: it is [B, heads, N of argument `rows`, dv]
    (rows: the index among q, k, v of the tensor af.qk reads as queries)."""

    rows: int
    heads: int
    dv: int


_LAYOUTS: dict[str, Layout] = {}


def _argument_index(value: SSAValue) -> int:
    """The function argument `value` derives from (through pre-matmul transforms)."""
    while not isinstance(value, BlockArgument):
        value = value.owner.operands[0]  # type: ignore[union-attr]
    return value.index


def layout_of(trace: dsl.Trace) -> Layout:
    """The output layout of a traced variant (cached per IR text)."""
    found = _LAYOUTS.get(trace.text)
    if found is None:
        func = next(op for op in trace.module.walk() if isinstance(op, FuncOp))
        qk = cast(attn.QKOp, next(op for op in trace.module.walk() if isinstance(op, attn.QKOp)))
        shape = cast(Any, func.function_type.outputs.data[0]).get_shape()
        found = _LAYOUTS[trace.text] = Layout(_argument_index(qk.q), shape[1], shape[3])
    return found


_REGISTRY: dict[str, OpTarget] = {}
_registry_lock = threading.Lock()


def _new_registry_lock() -> None:
    """In a forked child: a lock held by a parent's thread would never be released."""
    global _registry_lock
    _registry_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_registry_lock)


def register(target: OpTarget) -> OpTarget:
    """Make `target` the one its key names (replacing an equivalent older one)."""
    with _registry_lock:
        _REGISTRY[target.key] = target
    return target


def _target(key: str) -> OpTarget:
    try:
        return _REGISTRY[key]
    except KeyError:
        raise AttnFuseError(
            f"no AttnFuse kernel is registered under {key!r}: the attnfuse custom ops are called by variants, "
            f"with keys that this process made"
        ) from None


def clear() -> None:
    """Forget the kernel and reference targets (`af.runtime.clear_caches`); call sites
    traced by torch.compile stay, since compiled graphs name them."""
    with _registry_lock:
        for key in [k for k, t in _REGISTRY.items() if not isinstance(t, SiteTarget)]:
            del _REGISTRY[key]


def _as_float32(x: Tensor) -> Tensor:
    return x.float() if x.dtype == torch.bfloat16 else x


class KernelTarget(OpTarget):
    """A compiled forward kernel and its backward kernels.

    `spec` and `module` are the forward kernel's (a backward kernel's spec is the same
    with direction "bwd" and its `wrt`); `launch` launches the forward as the runtime does;
    `float32` says the call's bfloat16 tensors run the float32 kernels (the interpreter);
    `arg_names` name the function's arguments (q, k, v, then the extra tensors)."""

    def __init__(
        self,
        name: str,
        arg_names: Sequence[str],
        trace: dsl.Trace,
        spec: KernelSpec,
        launch: Callable[..., Any],
        float32: bool,
    ):
        self.name, self.arg_names, self.trace, self.spec = name, tuple(arg_names), trace, spec
        self._launch, self.float32 = launch, float32
        self.key = f"kernel:{spec.key()}:{'float32' if float32 else 'native'}"
        self._backward: dict[tuple[int, ...], Callable[..., Any]] = {}

    def forward(self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        return self._launch(q, k, v, *extras)

    def layout(self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]) -> Layout:
        return layout_of(self.trace)

    def backward_launch(self, wrt: tuple[int, ...]) -> Callable[..., Any]:
        """The backward kernel's launch for `wrt` (compiled on first use); AttnFuseError
        naming the argument when the compiler cannot differentiate with respect to it."""
        launch = self._backward.get(wrt)
        if launch is None:
            refuse_without_backward(self.spec.interpret, [self.arg_names[i] for i in wrt], self.name)
            spec = dataclasses.replace(self.spec, direction="bwd", wrt=wrt)
            try:
                launch = KERNELS.launcher(self.trace.module, spec)[1]
            except DiagnosticException as e:
                raise AttnFuseError(self._unsupported(wrt, str(e))) from e
            self._backward[wrt] = launch
        return launch

    def _unsupported(self, wrt: tuple[int, ...], message: str) -> str:
        """The error for a backward the compiler refused: the arguments of `wrt` its
        message names have no supported gradient; a message naming none is a failure of
        the backward lowering itself."""
        names = [self.arg_names[i] for i in wrt]
        named = [n for n in names if re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", message)]
        if not named:
            return (
                f"the Triton lowering cannot compile the backward of {self.name} for the gradients of "
                f"{', '.join(names)}: {message}"
            )
        what = " and ".join(named)
        return (
            f"{what} {'requires' if len(named) == 1 else 'require'} grad, but the gradient of {self.name} with "
            f"respect to {what} is not supported: {message}. Detach {'it' if len(named) == 1 else 'them'} or call "
            f"under torch.no_grad() (the reference backend differentiates it by plain autograd)"
        )

    def backward(
        self,
        wrt: Sequence[int],
        q: Tensor,
        k: Tensor,
        v: Tensor,
        extras: Sequence[Tensor],
        out: Tensor,
        lse: Tensor,
        dout: Tensor,
    ) -> list[Tensor]:
        launch = self.backward_launch(tuple(wrt))
        inputs = (q, k, v, *extras)
        args = [*inputs, out, lse, dout]
        if self.float32:
            args = [_as_float32(a) for a in args]
        grads = launch(*args)
        return [g.to(inputs[i].dtype) for i, g in zip(wrt, grads, strict=True)]


def refuse_without_backward(interpret: bool, names: Sequence[str], variant: str) -> None:
    """Raise `AttnFuseError` when the compile function in effect builds no backward kernels
    (`cache.compiles_backward`): the arguments `names` require grad, and the output must
    not be detached from autograd."""
    if names and not compiles_backward():
        mode = "interpret" if interpret else "triton"
        raise AttnFuseError(
            f"{', '.join(names)} {'requires' if len(names) == 1 else 'require'} grad, but the {mode} backend has no "
            f"backward yet (the compile function in effect builds none): {variant} would return an output detached "
            f"from autograd. Call it under torch.no_grad() or on detached tensors, or use af.backend('reference'), "
            f"which is differentiable"
        )


_NO_AUTOGRAD = (
    torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
    | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradOther)
    | torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
)


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Record autograd inside the block, even within a custom op's implementation (where
    the dispatcher has excluded the autograd keys): reference gradients are formed by
    running autograd over the reference executor."""
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set() - _NO_AUTOGRAD
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield


class ReferenceTarget(OpTarget):
    """The reference executor (compute in float32, out in q's dtype); the backward
    recomputes it under autograd."""

    def __init__(self, trace: dsl.Trace):
        self.trace = trace
        self.key = f"reference:{hashlib.sha256(trace.text.encode()).hexdigest()}"

    def forward(self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        out, lse = run_reference_with_lse(self.trace.module, q, k, v, *extras, compute_dtype=reference_dtype(q))
        return out.to(q.dtype).clone(), lse.float().clone()

    def layout(self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]) -> Layout:
        return layout_of(self.trace)

    def backward(
        self,
        wrt: Sequence[int],
        q: Tensor,
        k: Tensor,
        v: Tensor,
        extras: Sequence[Tensor],
        out: Tensor,
        lse: Tensor,
        dout: Tensor,
    ) -> list[Tensor]:
        with recording():
            inputs = [x.detach().requires_grad_(i in wrt) for i, x in enumerate((q, k, v, *extras))]
            again = run_reference(self.trace.module, *inputs, compute_dtype=reference_dtype(q)).to(q.dtype)
            grads = torch.autograd.grad(again, [inputs[i] for i in wrt], dout, allow_unused=True)
        return [torch.zeros_like(inputs[i]) if g is None else g for i, g in zip(wrt, grads, strict=True)]


class SiteTarget(OpTarget):
    """A variant call site traced by torch.compile: the variant, the backend in effect when
    it was traced, and the given extra arguments with their tensors left out (`consts`:
    per argument, (True, None) for a tensor or (False, value))."""

    def __init__(self, variant: VariantLike, backend: str, consts: tuple[tuple[bool, object], ...], key: str):
        self.variant, self.backend, self.consts, self.key = variant, backend, consts, key

    def _extras(self, tensors: Sequence[Tensor]) -> tuple[object, ...]:
        given = iter(tensors)
        return tuple(next(given) if is_tensor else value for is_tensor, value in self.consts)

    def resolve(
        self, q: Tensor, k: Tensor, v: Tensor, tensors: Sequence[Tensor]
    ) -> tuple[OpTarget, tuple[Tensor, ...]]:
        """The target for these tensors (validated as an eager call is) and the function's
        extra tensors (the given ones, and tensor defaults)."""
        return self.variant._op_target(self.backend, q, k, v, self._extras(tensors))

    def forward(self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        now = current_backend()
        if now != self.backend and kernel_mode(now, q) != kernel_mode(self.backend, q):
            raise AttnFuseError(
                f"this call of {self.variant.__name__} was traced by torch.compile under backend {self.backend!r} "
                f"and runs under {now!r}: compiled code keeps the backend it was traced with (torch.compile does "
                f"not see af.backend). Run it under {self.backend!r}, or call torch.compiler.reset() to trace again"
            )
        target, tensors = self.resolve(q, k, v, extras)
        return target.forward(q, k, v, tensors)

    def backward(
        self,
        wrt: Sequence[int],
        q: Tensor,
        k: Tensor,
        v: Tensor,
        extras: Sequence[Tensor],
        out: Tensor,
        lse: Tensor,
        dout: Tensor,
    ) -> list[Tensor]:
        target, tensors = self.resolve(q, k, v, extras)
        if len(tensors) != len(extras):  # tensor defaults: the function's indices move past the given ones
            raise AttnFuseError(
                f"{self.variant.__name__} under torch.compile: a default tensor argument cannot be differentiated "
                f"through; pass it explicitly"
            )
        return target.backward(wrt, q, k, v, tensors, out, lse, dout)

    def layout(self, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]) -> Layout:
        meta = [_meta(t) for t in (q, k, v)]
        trace = self.variant._validated_trace(meta[0], meta[1], meta[2], self._extras([_meta(t) for t in extras]))[0]
        return layout_of(trace)


def _meta(t: Tensor) -> Tensor:
    """A meta tensor of `t`'s dtype and shape (a symbolic size as its hint, else 1):
    tracing reads only dtypes, ranks, head counts and dims and fixed extra shapes."""

    def size(d: Any) -> int:
        if isinstance(d, int):
            return d
        hint = getattr(getattr(d, "node", None), "hint", None)
        return hint if isinstance(hint, int) else 1

    return torch.empty([size(d) for d in t.shape], dtype=t.dtype, device="meta")


_VARIANTS: weakref.WeakValueDictionary[str, VariantLike] = weakref.WeakValueDictionary()
_SITES: dict[tuple[str, str, tuple[tuple[bool, object], ...]], SiteTarget] = {}
_numbers = itertools.count(1)


def variant_handle(variant: VariantLike) -> str:
    """A name for `variant` in this process (`Variant.__init__` takes one; a string, since
    torch.compile may turn an integer attribute into a symbolic one): torch.compile passes
    it, a constant, where some torch versions cannot pass the object itself."""
    with _registry_lock:
        handle = f"{variant.__name__}#{next(_numbers)}"
        _VARIANTS[handle] = variant
    return handle


def variant_of(handle: str) -> VariantLike:
    """The variant a `variant_handle` names."""
    return _VARIANTS[handle]


@torch._dynamo.assume_constant_result
def _site_key(handle: str, consts: tuple[tuple[bool, object], ...]) -> str:
    """The key of a call site of the variant of this `handle` (`variant_handle`): run by
    torch.compile when it traces the call (the result is a constant of the graph), reading
    the backend in effect then."""
    backend = current_backend()
    with _registry_lock:
        site = _SITES.get((handle, backend, consts))
        if site is None:
            key = f"site:{handle}:{len(_SITES)}"
            site = _SITES[(handle, backend, consts)] = SiteTarget(_VARIANTS[handle], backend, consts, key)
            _REGISTRY[key] = site
    return site.key


def _specialized(x: object) -> object:
    """A constant argument as the value the IR bakes in. torch.compile makes a Python int
    or float that changed between calls symbolic (automatic dynamic shapes), which
    `_site_key` cannot take; reading its exact value (`operator.index`, `float.hex`) has
    dynamo specialise it instead: the graph guards on the value and is traced again for
    another one (as a new constant means a new IR)."""
    if isinstance(x, bool):
        return x
    if isinstance(x, int):
        return operator.index(x)
    if isinstance(x, float):
        return float.fromhex(x.hex())
    return x


def site_call(variant: VariantLike, q: Tensor, k: Tensor, v: Tensor, extras: tuple[object, ...]) -> Tensor:
    """A variant call inside code torch.compile traces: one `attnfuse::attention` node."""
    consts = tuple((True, None) if isinstance(x, torch.Tensor) else (False, _specialized(x)) for x in extras)
    tensors = [x for x in extras if isinstance(x, torch.Tensor)]
    return torch.ops.attnfuse.attention(_site_key(variant._handle, consts), q, k, v, tensors)[0]


# --------------------------------------------------------------------------- the ops


@torch.library.custom_op("attnfuse::attention", mutates_args=())
def attention(key: str, q: Tensor, k: Tensor, v: Tensor, extras: list[Tensor]) -> tuple[Tensor, Tensor]:
    """(out, lse) of the variant kernel `key` names (see the module docstring); out laid out in
    the order of the queries' tensor, as the fake says (a target's output in another layout,
    e.g. the reference executor's or an FP8 kernel's, is copied into that one)."""
    target = _target(key)
    out, lse = target.forward(q, k, v, extras)
    rows = (q, k, v)[target.layout(q, k, v, extras).rows]
    if _heads_inner(rows):
        if not out.transpose(1, 2).is_contiguous():
            out = _empty_ordered(rows, out.shape, out.dtype, out.device).copy_(out)
    elif not out.is_contiguous():
        out = out.contiguous()
    return out, lse


@attention.register_fake
def _attention_fake(key: str, q: Tensor, k: Tensor, v: Tensor, extras: list[Tensor]) -> tuple[Tensor, Tensor]:
    layout = _target(key).layout(q, k, v, extras)
    rows = (q, k, v)[layout.rows]
    b, n = q.shape[0], rows.shape[2]
    out = _empty_ordered(rows, (b, layout.heads, n, layout.dv), q.dtype, q.device)
    return out, q.new_empty((b, layout.heads, n), dtype=torch.float32)


@torch.library.custom_op("attnfuse::attention_backward", mutates_args=())
def attention_backward(
    key: str,
    wrt: list[int],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    extras: list[Tensor],
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
) -> list[Tensor]:
    """The gradients of the arguments `wrt` (indices: 0, 1, 2 for q, k, v, 3... for the
    extra tensors), one per index, in that order; q's, k's and v's laid out in their input's
    order, as the fake says (as SDPA's: a transposed view's gradient is then a view of a
    contiguous tensor; a target's gradient in another layout is copied into that one)."""
    inputs = (q, k, v)
    grads = _target(key).backward(wrt, q, k, v, extras, out, lse, dout)
    for j, (i, g) in enumerate(zip(wrt, grads, strict=True)):
        if i < 3 and _heads_inner(inputs[i]) and not g.transpose(1, 2).is_contiguous():
            grads[j] = _empty_ordered(inputs[i], g.shape, g.dtype, g.device).copy_(g)
        elif i < 3 and not _heads_inner(inputs[i]) and not g.is_contiguous():
            grads[j] = g.contiguous()
    return grads


@attention_backward.register_fake
def _attention_backward_fake(
    key: str,
    wrt: list[int],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    extras: list[Tensor],
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
) -> list[Tensor]:
    inputs = (q, k, v, *extras)
    return [
        _empty_ordered(x, x.shape, x.dtype, x.device) if i < 3 else x.new_empty(x.shape)
        for i, x in ((i, inputs[i]) for i in wrt)
    ]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    key, q, k, v, extras = inputs
    out, lse = output
    ctx.key, ctx.target, ctx.n_extras = key, _REGISTRY.get(key), len(extras)
    ctx.save_for_backward(q, k, v, *extras, out, lse)
    ctx.mark_non_differentiable(lse)


def _backward(ctx: Any, dout: Tensor, dlse: Tensor | None) -> tuple[Any, ...]:
    q, k, v, *rest = ctx.saved_tensors
    extras, out, lse = rest[: ctx.n_extras], rest[-2], rest[-1]
    needs = ctx.needs_input_grad  # (key, q, k, v, [one per extra tensor])
    flags = [needs[1], needs[2], needs[3], *needs[4]]
    wrt = [i for i, needed in enumerate(flags) if needed]
    grads: list[Tensor | None] = [None] * len(flags)
    if wrt:
        if ctx.target is not None and ctx.key not in _REGISTRY:  # forgotten by clear_caches since
            register(ctx.target)
        for i, g in zip(wrt, attention_backward(ctx.key, wrt, q, k, v, extras, out, lse, dout), strict=True):
            grads[i] = g
    return None, grads[0], grads[1], grads[2], grads[3:]


def _double_backward(ctx: Any, *grads: Any) -> Any:
    raise AttnFuseError(
        "AttnFuse variants support one backward: differentiating their gradients (double backward, e.g. "
        "create_graph=True and a second backward through the result) is not supported"
    )


attention.register_autograd(_backward, setup_context=_setup_context)
attention_backward.register_autograd(_double_backward)
