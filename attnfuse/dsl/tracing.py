"""Tracing: a variant function called on symbolic q, k, v and extras becomes a `func.func`.

`trace` runs the variant function once per argument signature with proxies instead of
tensors: `TensorProxy` for q, k, v (and for them after pre-matmul blocks, and for the
output of `pv`), `ScoresProxy` and `ProbsProxy` for the score and probability
matrices, `ExtraProxy` for extra tensor arguments. The blocks (`attnfuse.dsl.blocks`)
append `attn` ops through the thread's `_Tracer`, which also traces custom functions
into regions (`_Tracer.trace_region`, with the scalars of `attnfuse.dsl.scalars`).
What comes out is a `Trace`: the module, its canonical text, and what it requires of
each extra tensor (`ExtraSpec`), which the runtime checks before every launch.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    ModuleOp,
    TensorType,
    bf16,
    f16,
    f32,
    i1,
    i32,
    i64,
)
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects import attn
from attnfuse.dsl.scalars import Scalar, _current_region, _describe, _lift, _local, _Proxy, _Region, _to_float
from attnfuse.errors import AttnFuseError

ELEMENT_TYPES: dict[torch.dtype, Attribute] = {
    torch.float16: f16,
    torch.bfloat16: bf16,
    torch.float32: f32,
    torch.int32: i32,
    torch.int64: i64,
    torch.bool: i1,
}
"""torch dtypes a variant's tensors may have, and their IR element types."""

QKV_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""dtypes of q, k and v."""


# --------------------------------------------------------------------------- trace inputs and outputs


@dataclass(frozen=True)
class TensorArg:
    """What tracing knows of a tensor argument: its dtype and the shape of the first
    call (only static dims end up in the IR)."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @staticmethod
    def of(t: torch.Tensor) -> TensorArg:
        return TensorArg(t.dtype, tuple(t.shape))


@dataclass
class ExtraSpec:
    """What the traced IR requires of one extra tensor argument.

    `static_shape` is set when a named block fixes the shape (ALiBi slopes and sink
    logits [Hq], QK-norm weights [D], RoPE inv_freq [rotary_dim / 2]); the IR type then
    carries it. Otherwise every dim is dynamic and `dim_reqs` lists what the uses
    need: (dim, "eq" or "ge", size symbol or an int, why), the symbols being "B" (the
    batch), "Hq" (q's heads), "Nq" (q's length) and "Nk" (k's length), e.g. document ids
    [B, Nk] or RoPE positions [B, Nq] of q."""

    name: str
    position: int
    """Position among the variant's arguments (q, k, v are 0, 1, 2)."""
    dtype: torch.dtype
    ndim: int
    static_shape: tuple[int, ...] | None = None
    static_reason: str = ""
    dim_reqs: list[tuple[int, str, str | int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Trace:
    """A traced variant: its IR (a module holding one `func.func`) and canonical text."""

    module: ModuleOp
    text: str
    extras: tuple[ExtraSpec | None, ...]
    """One entry per argument after q, k, v; None for a non-tensor (constant) argument."""


# --------------------------------------------------------------------------- tracing state


def _tracer(what: str) -> _Tracer:
    t = getattr(_local, "tracer", None)
    if t is None:
        raise AttnFuseError(
            f"{what} works on the symbolic tensors of a variant being traced: call it inside a "
            f"function decorated with @af.variant"
        )
    if t.region is not None:
        raise AttnFuseError(
            f"{what} cannot be used inside {t.region.what}: a custom function computes one score element from scalars"
        )
    return t


class _Extra:
    """An extra tensor argument of the variant being traced."""

    def __init__(self, name: str, position: int, arg: TensorArg, value: BlockArgument):
        self.name = name
        self.spec = ExtraSpec(name, position, arg.dtype, len(arg.shape))
        self.first_shape = arg.shape
        self.element_type = ELEMENT_TYPES[arg.dtype]
        self.value: SSAValue = value
        self.region_args: list[BlockArgument] = []

    def require_static(self, shape: tuple[int, ...], reason: str, *, floating: bool = True) -> None:
        """A named block needs this tensor to have exactly `shape` (and a float dtype)."""
        spec = self.spec
        if floating and not spec.dtype.is_floating_point:
            raise AttnFuseError(f"{self.name} ({reason}) must be a float tensor, got dtype {spec.dtype}")
        if spec.ndim != len(shape) or self.first_shape != shape:
            raise AttnFuseError(f"{self.name} ({reason}) must have shape {list(shape)}, got {list(self.first_shape)}")
        if spec.static_shape is not None:
            if spec.static_shape != shape:
                raise AttnFuseError(
                    f"{self.name} is used as {spec.static_reason} (shape {list(spec.static_shape)}) "
                    f"and as {reason} (shape {list(shape)})"
                )
            return
        spec.static_shape, spec.static_reason = shape, reason
        new_type = TensorType(self.element_type, shape)
        self.value = Rewriter.replace_value_with_new_type(self.value, new_type)
        # Retyping a block argument gives a block argument.
        self.region_args = [
            cast(BlockArgument, Rewriter.replace_value_with_new_type(a, new_type)) for a in self.region_args
        ]

    def require_dim(self, dim: int, rel: str, size: str | int, reason: str) -> None:
        req = (dim, rel, size, reason)
        if req not in self.spec.dim_reqs:
            self.spec.dim_reqs.append(req)


def _check_arity(fn: object, what: str, n: int) -> None:
    if not callable(fn):
        raise AttnFuseError(f"{what} expects a callable, got {_describe(fn)}")
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        args = "score, b, h, q_idx, kv_idx" if n == 5 else "b, h, q_idx, kv_idx"
        raise AttnFuseError(
            f"{what} must take ({args}), got {getattr(fn, '__name__', fn)}{inspect.signature(fn)}"
        ) from None
    except ValueError:  # builtins without a signature: let the call decide
        pass


class _Tracer:
    """Builds the `func.func` of one variant for one argument signature."""

    def __init__(self, name: str, arg_names: Sequence[str], args: Sequence[TensorArg | object]):
        self.name = name
        q, k, v = args[:3]
        assert isinstance(q, TensorArg) and isinstance(k, TensorArg) and isinstance(v, TensorArg)
        self.out_dtype = q.dtype
        # q, k, v, then the extra tensors; extras start with every dim dynamic and get the
        # static shape a named block needs when one uses them (`_Extra.require_static`).
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, TensorArg)]
        types: list[Attribute] = [_qkv_type(a) for a in (q, k, v)]
        types += [TensorType(ELEMENT_TYPES[a.dtype], [DYNAMIC_INDEX] * len(a.shape)) for _, a in tensors[3:]]
        self.block = Block(arg_types=types)
        for value, (i, _) in zip(self.block.args, tensors, strict=True):
            value.name_hint = _ident(arg_names[i])
        self.proxies: list[Any] = [
            TensorProxy(self.block.args[i], arg_names[i], a.shape[1], a.shape[3], a.dtype)
            for i, a in enumerate((q, k, v))
        ]
        self.extras: list[_Extra | None] = []
        values = iter(self.block.args[3:])
        for i, a in enumerate(args[3:], start=3):
            if isinstance(a, TensorArg):
                extra = _Extra(arg_names[i], i, a, next(values))
                self.extras.append(extra)
                self.proxies.append(ExtraProxy(extra))
            else:
                self.extras.append(None)
                self.proxies.append(a)
        self.region: _Region | None = None

    def emit(self, op: Operation, what: str) -> SSAValue:
        """Append a variant-level op and verify it at once, so that a bad block is
        reported where it is called."""
        self.block.add_op(op)
        try:
            op.verify()
        except VerifyException as e:
            raise AttnFuseError(f"{what}: {e}") from None
        return op.results[0]

    def trace_region(self, fn: Callable[..., Any], what: str, kind: str) -> tuple[Region, list[_Extra]]:
        """Trace `fn` into the region of a custom mask, bias or score_mod (`kind`);
        returns the region and the extra tensors it reads, in order of first use."""
        has_score = kind == "score_mod"
        _check_arity(fn, what, 5 if has_score else 4)
        region = _Region(what, has_score)
        self.region = region
        try:
            result = fn(*region.args)
        except AttnFuseError:
            raise
        except Exception as e:
            raise AttnFuseError(
                f"while tracing {what}: {type(e).__name__}: {e} (a traced function can use its arguments, "
                f"Python numbers, af.* functions and elements of the variant's tensor arguments, e.g. ids[b, kv_idx])"
            ) from e
        finally:
            self.region = None
        if isinstance(result, Scalar) and result.region is not region:
            raise AttnFuseError(f"{what} returned a value traced in another function")
        if kind == "mask":
            if isinstance(result, bool):
                result = region.const(result)
            if not (isinstance(result, Scalar) and result.kind == "bool"):
                raise AttnFuseError(
                    f"{what} must return a boolean (a comparison, or & | ~ of comparisons), got {_describe(result)}"
                )
        else:
            if isinstance(result, numbers.Real) and not isinstance(result, Scalar):
                result = region.float_const(result)
            if not isinstance(result, Scalar):
                raise AttnFuseError(f"{what} must return a number, got {_describe(result)}")
            result = _to_float(result)
        region.block.add_op(attn.YieldOp(result.value))
        return Region(region.block), region.extras

    def finish(self, result: object) -> Trace:
        if not (isinstance(result, TensorProxy) and result.is_output):
            raise AttnFuseError(f"variant '{self.name}' must return the result of af.pv(...), got {_describe(result)}")
        self.block.add_op(ReturnOp(result.value))
        _erase_dead_ops(self.block)
        inputs = [a.type for a in self.block.args]
        func = FuncOp(self.name, (inputs, [result.value.type]), Region(self.block))
        module = ModuleOp([func])
        try:
            module.verify()
        except VerifyException as e:
            raise AttnFuseError(f"the traced IR of variant '{self.name}' is invalid: {e}") from None
        specs = tuple(None if e is None else e.spec for e in self.extras)
        return Trace(module, str(module), specs)


def _erase_dead_ops(block: Block) -> None:
    """Drop ops whose results nothing uses (blocks computed but not returned)."""
    for op in reversed(list(block.ops)):
        if op.results and all(not r.uses for r in op.results):
            block.erase_op(op)


def _qkv_type(a: TensorArg) -> TensorType:
    return TensorType(ELEMENT_TYPES[a.dtype], [DYNAMIC_INDEX, a.shape[1], DYNAMIC_INDEX, a.shape[3]])


def _ident(name: str) -> str:
    return name if name.isidentifier() else "arg"


def trace(fn: Callable[..., Any], name: str, arg_names: Sequence[str], args: Sequence[TensorArg | object]) -> Trace:
    """Trace variant function `fn` for one argument signature: `args` describes q, k, v
    (TensorArgs) and then each extra argument (a TensorArg, or a constant passed as
    is). Bad blocks and unsupported Python constructs raise `AttnFuseError`."""
    if getattr(_local, "tracer", None) is not None:
        raise AttnFuseError(f"variant '{name}' was called while another variant is being traced")
    tracer = _Tracer(name, arg_names, args)
    _local.tracer = tracer
    try:
        result = fn(*tracer.proxies)
        return tracer.finish(result)
    except AttnFuseError:
        raise
    except Exception as e:
        raise AttnFuseError(f"while tracing variant '{name}': {type(e).__name__}: {e}") from e
    finally:
        _local.tracer = None


# --------------------------------------------------------------------------- proxies


class TensorProxy(_Proxy):
    """q, k or v (or one of them after pre-matmul blocks), or the output of `pv`."""

    __slots__ = ("value", "name", "heads", "head_dim", "dtype", "is_output")

    def __init__(
        self,
        value: SSAValue,
        name: str,
        heads: int,
        head_dim: int,
        dtype: torch.dtype,
        is_output: bool = False,
    ):
        self.value, self.name, self.heads, self.head_dim, self.dtype = value, name, heads, head_dim, dtype
        self.is_output = is_output

    def __repr__(self) -> str:
        return f"<{self.name}: [B, {self.heads}, N, {self.head_dim}] {self.dtype}>"

    def _no_arith(self, *_: object) -> None:
        raise AttnFuseError(
            f"{self!r} is symbolic while tracing: transform q and k with af.rope, af.qk_norm and "
            f"af.scale, and scores with af.qk, af.mask, af.bias, af.softcap, af.score_mod"
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_arith
    __truediv__ = __rtruediv__ = __matmul__ = __rmatmul__ = __neg__ = __getitem__ = _no_arith


class ScoresProxy(_Proxy):
    """The score matrix `[B, heads, Nq, Nk]` (result of `qk` and post-matmul blocks)."""

    __slots__ = ("value", "heads")

    def __init__(self, value: SSAValue, heads: int):
        self.value, self.heads = value, heads

    def __repr__(self) -> str:
        return f"<scores: [B, {self.heads}, Nq, Nk]>"

    def _no_arith(self, *_: object) -> None:
        raise AttnFuseError(
            f"{self!r} is symbolic while tracing: modify scores with af.scale, af.mask, af.bias, "
            f"af.softcap or af.score_mod(s, fn)"
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_arith
    __truediv__ = __rtruediv__ = __matmul__ = __neg__ = __getitem__ = _no_arith


class ProbsProxy(_Proxy):
    """Softmax probabilities (only `pv` consumes them)."""

    __slots__ = ("value", "heads")

    def __init__(self, value: SSAValue, heads: int):
        self.value, self.heads = value, heads

    def __repr__(self) -> str:
        return f"<probs: [B, {self.heads}, Nq, Nk]>"


class ExtraProxy(_Proxy):
    """An extra tensor argument of the variant: pass it to a named block
    (af.alibi(slopes), af.document(ids), af.softmax(s, sink=...), af.qk_norm(x, w),
    af.rope(x, inv_freq=...), af.rope(x, positions=...)) or index it inside a custom
    function."""

    __slots__ = ("_extra",)

    def __init__(self, extra: _Extra):
        self._extra = extra

    @property
    def ndim(self) -> int:
        return self._extra.spec.ndim

    @property
    def dtype(self) -> torch.dtype:
        return self._extra.spec.dtype

    def __repr__(self) -> str:
        return f"<{self._extra.name}: {self._extra.spec.ndim}-d {self._extra.spec.dtype} tensor>"

    def _not_a_scalar(self) -> str:
        return f"{self!r} is a tensor: index it to read an element (e.g. {self._extra.name}[h])"

    def _no_arith(self, *_: object) -> None:
        raise AttnFuseError(self._not_a_scalar())

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _no_arith
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _no_arith  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    def __getitem__(self, index: object) -> Scalar:
        extra = self._extra
        region = _current_region(f"indexing {extra.name}")
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) != extra.spec.ndim:
            raise AttnFuseError(
                f"{extra.name} has {extra.spec.ndim} dims and needs {extra.spec.ndim} indices, got {len(idx)}"
            )
        values = []
        for d, i in enumerate(idx):
            if isinstance(i, slice) or i is Ellipsis or i is None:
                raise AttnFuseError(f"{extra.name}[...] reads one element: slices are not supported")
            s = _lift(i, region)
            if s.kind != "int":
                raise AttnFuseError(f"index {d} of {extra.name} must be an integer, got a {s.kind}")
            if isinstance(i, int):
                if i < 0:
                    raise AttnFuseError(f"index {d} of {extra.name} must be >= 0, got {i}")
                extra.require_dim(d, "ge", i + 1, f"indexed with {i}")
            elif s.symbol in _INDEX_SIZES:
                size = _INDEX_SIZES[s.symbol]
                extra.require_dim(d, "ge", size, f"indexed with {s.symbol}")
            values.append(s.value)
        arg = region.extra_arg(extra)
        value = region.emit(attn.ExtractOp(arg, values))
        t = value.type
        if t in (f16, bf16) or isinstance(t, BFloat16Type):
            return Scalar(region.emit(arith.ExtFOp(value, f32)), "float", region)
        if t == f32:
            return Scalar(value, "float", region)
        if t == i1:
            return Scalar(value, "bool", region)
        if t == i64:
            return Scalar(region.emit(arith.TruncIOp(value, i32)), "int", region)
        return Scalar(value, "int", region)


_INDEX_SIZES = {"b": "B", "h": "Hq", "q_idx": "Nk", "kv_idx": "Nk"}
"""How large a dim indexed directly by a region argument must be (positions < Nk)."""
