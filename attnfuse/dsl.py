"""The Python front end: the ten building blocks, traced into `attn` IR.

A variant is a Python function of `(q, k, v, *extras)`. The runtime calls it once per
argument signature with symbolic proxies instead of tensors (`trace`); each building
block (`rope`, `qk_norm`, `scale`, `qk`, `mask`, `bias`, `softcap`, `score_mod`,
`softmax`, `pv`) appends the matching `attn` op to a `func.func`, and the function's
return value, the result of `pv`, becomes the function's result.

Custom predicates `fn(b, h, q_idx, kv_idx)`, biases (same arguments) and score
modifiers `fn(score, b, h, q_idx, kv_idx)` are Python callables traced into the
region of a `custom` `attn.mask`/`attn.bias`/`attn.score_mod`: their arguments are
`Scalar` proxies, and arithmetic on them appends `arith`/`math` ops to the region.
`q_idx` and `kv_idx` are *positions*: kv 0..Nk-1, queries Nk-Nq..Nk-1.

Scalar semantics inside regions:

- Python ints are i32, floats f32, booleans i1. Mixing an int and a float converts
  the int (`arith.sitofp`); booleans take part in arithmetic as 0/1 (`arith.extui`).
- `/` always gives a float, as in Python. `//` and `%` on ints round toward minus
  infinity, as in Python: `a // b` is `arith.floordivsi` and `a % b` is
  `a - (a // b) * b`, so `-7 // 2 == -4` and `-7 % 2 == 1`. They need int operands.
- `&`, `|`, `^`, `~` are logical on booleans and bitwise on ints; comparisons give
  booleans. Python's `and`, `or`, `not`, `if` and chained comparisons need a concrete
  truth value and raise `AttnFuseError`: use `&`, `|`, `~` and `where`.
- Indexing an extra tensor of the variant (`ids[b, kv_idx]`) reads one element
  (`attn.extract`); the tensor becomes an operand of the op and an argument of its
  region. Float elements are widened to f32 and int64 elements narrowed to i32.
"""

from __future__ import annotations

import inspect
import math
import numbers
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.dialects import arith
from xdsl.dialects import math as xmath
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    FloatAttr,
    IntegerAttr,
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

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

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
    need: (dim, "eq" or "ge", size symbol "B"/"Hq"/"Nk" or an int, why)."""

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

_local = threading.local()


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


def _current_region(what: str) -> _Region:
    t = getattr(_local, "tracer", None)
    region = t.region if t is not None else None
    if region is None:
        raise AttnFuseError(
            f"{what} is only meaningful inside a custom mask, bias or score_mod function "
            f"(fn(b, h, q_idx, kv_idx) or fn(score, b, h, q_idx, kv_idx)) being traced"
        )
    return region


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
        self.region_args = [Rewriter.replace_value_with_new_type(a, new_type) for a in self.region_args]

    def require_dim(self, dim: int, rel: str, size: str | int, reason: str) -> None:
        req = (dim, rel, size, reason)
        if req not in self.spec.dim_reqs:
            self.spec.dim_reqs.append(req)


class _Region:
    """The region of a custom mask, bias or score_mod being traced."""

    def __init__(self, what: str, has_score: bool):
        self.what = what
        names = (["score"] if has_score else []) + ["b", "h", "q_idx", "kv_idx"]
        self.block = Block(arg_types=([f32] if has_score else []) + [i32] * 4)
        for a, n in zip(self.block.args, names, strict=True):
            a.name_hint = n
        self.args = [
            Scalar(a, "float" if n == "score" else "int", self, symbol=n)
            for a, n in zip(self.block.args, names, strict=True)
        ]
        self.extras: list[_Extra] = []
        self.consts: dict[tuple[Attribute, Any], SSAValue] = {}

    def emit(self, op: Operation) -> SSAValue:
        self.block.add_op(op)
        return op.results[0]

    def const(self, value: bool | int | float) -> Scalar:
        if isinstance(value, bool):
            t, kind, attr = i1, "bool", IntegerAttr(int(value), i1)
        elif isinstance(value, int):
            if not _I32_MIN <= value <= _I32_MAX:
                raise AttnFuseError(f"integer constant {value} in {self.what} does not fit in i32")
            t, kind, attr = i32, "int", IntegerAttr(value, i32)
        else:
            t, kind, attr = f32, "float", FloatAttr(float(value), f32)
        key = (t, value if t != f32 else float(value).hex())
        if key not in self.consts:
            self.consts[key] = self.emit(arith.ConstantOp(attr))
        return Scalar(self.consts[key], kind, self)

    def extra_arg(self, extra: _Extra) -> BlockArgument:
        """The region argument standing for `extra`, added on first use."""
        if extra not in self.extras:
            arg = self.block.insert_arg(extra.value.type, len(self.block.args))
            arg.name_hint = extra.name
            extra.region_args.append(arg)
            self.extras.append(extra)
        return extra.region_args[[r.block for r in extra.region_args].index(self.block)]


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
                result = region.const(float(result))
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


def _describe(x: object) -> str:
    if isinstance(x, _Proxy):
        return repr(x)
    return f"a {type(x).__name__}"


class _Proxy:
    """Base of symbolic values: they have no truth value while tracing."""

    __slots__ = ()

    def __bool__(self) -> bool:
        raise AttnFuseError(
            f"{self!r} has no concrete truth value while tracing: Python's `and`, `or`, `not`, `if` "
            f"and chained comparisons (a < b < c) cannot be traced; use `&`, `|`, `~` and af.where(c, x, y)"
        )

    def __index__(self) -> int:
        raise AttnFuseError(
            f"{self!r} is symbolic and cannot be used as a Python index or int; index only tensors that "
            f"are arguments of the variant (e.g. ids[b, kv_idx])"
        )

    def __float__(self) -> float:
        raise AttnFuseError(
            f"{self!r} is symbolic and cannot become a Python float; use af.exp, af.tanh, ... instead "
            f"of math.* functions"
        )

    __int__ = __index__

    def __len__(self) -> int:
        raise AttnFuseError(f"{self!r} is symbolic and has no Python length")

    def __iter__(self):
        raise AttnFuseError(f"{self!r} is symbolic and cannot be iterated")


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
    af.rope(x, inv_freq=...)) or index it inside a custom function."""

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

    def _no_arith(self, *_: object) -> None:
        raise AttnFuseError(f"{self!r} is a tensor: index it to read an element (e.g. {self._extra.name}[h])")

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


class Scalar(_Proxy):
    """A traced scalar inside a custom function: kind "bool" (i1), "int" (i32) or
    "float" (f32)."""

    __slots__ = ("value", "kind", "region", "symbol")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, value: SSAValue, kind: str, region: _Region, symbol: str | None = None):
        self.value, self.kind, self.region, self.symbol = value, kind, region, symbol

    def __repr__(self) -> str:
        return f"<{self.symbol or 'traced'} {self.kind}>"

    def __add__(self, o: object) -> Scalar:
        return _arith(self, o, arith.AddiOp, arith.AddfOp)

    def __radd__(self, o: object) -> Scalar:
        return _arith(o, self, arith.AddiOp, arith.AddfOp)

    def __sub__(self, o: object) -> Scalar:
        return _arith(self, o, arith.SubiOp, arith.SubfOp)

    def __rsub__(self, o: object) -> Scalar:
        return _arith(o, self, arith.SubiOp, arith.SubfOp)

    def __mul__(self, o: object) -> Scalar:
        return _arith(self, o, arith.MuliOp, arith.MulfOp)

    def __rmul__(self, o: object) -> Scalar:
        return _arith(o, self, arith.MuliOp, arith.MulfOp)

    def __truediv__(self, o: object) -> Scalar:
        return _arith(self, o, None, arith.DivfOp)

    def __rtruediv__(self, o: object) -> Scalar:
        return _arith(o, self, None, arith.DivfOp)

    def __floordiv__(self, o: object) -> Scalar:
        return _floordiv(self, o)

    def __rfloordiv__(self, o: object) -> Scalar:
        return _floordiv(o, self)

    def __mod__(self, o: object) -> Scalar:
        return _mod(self, o)

    def __rmod__(self, o: object) -> Scalar:
        return _mod(o, self)

    def __pow__(self, o: object) -> Scalar:
        return _arith(self, o, None, xmath.PowFOp)

    def __rpow__(self, o: object) -> Scalar:
        return _arith(o, self, None, xmath.PowFOp)

    def __neg__(self) -> Scalar:
        r = _current_region("-x")
        if self.kind == "float":
            return Scalar(r.emit(arith.NegfOp(self.value)), "float", r)
        return _arith(0, self, arith.SubiOp, arith.SubfOp)

    def __pos__(self) -> Scalar:
        return self

    def __abs__(self) -> Scalar:
        return abs_(self)

    def __and__(self, o: object) -> Scalar:
        return _bitwise(self, o, arith.AndIOp, "&")

    __rand__ = __and__

    def __or__(self, o: object) -> Scalar:
        return _bitwise(self, o, arith.OrIOp, "|")

    __ror__ = __or__

    def __xor__(self, o: object) -> Scalar:
        return _bitwise(self, o, arith.XOrIOp, "^")

    __rxor__ = __xor__

    def __invert__(self) -> Scalar:
        r = _current_region("~x")
        if self.kind == "float":
            raise AttnFuseError("~ needs a boolean or an integer, got a float")
        ones = r.const(True if self.kind == "bool" else -1)
        return Scalar(r.emit(arith.XOrIOp(self.value, ones.value)), self.kind, r)

    def __lt__(self, o: object) -> Scalar:
        return _compare(self, o, "lt")

    def __le__(self, o: object) -> Scalar:
        return _compare(self, o, "le")

    def __gt__(self, o: object) -> Scalar:
        return _compare(self, o, "gt")

    def __ge__(self, o: object) -> Scalar:
        return _compare(self, o, "ge")

    def __eq__(self, o: object) -> Scalar:  # type: ignore[override]
        return _compare(self, o, "eq")

    def __ne__(self, o: object) -> Scalar:  # type: ignore[override]
        return _compare(self, o, "ne")


# --------------------------------------------------------------------------- scalar emission


def _lift(x: object, region: _Region) -> Scalar:
    """A Scalar of this region for a traced value or a Python constant."""
    if isinstance(x, Scalar):
        if x.region is not region:
            raise AttnFuseError(
                f"{x!r} belongs to another traced function: a custom function can only use its own "
                f"arguments, constants and indexed extra tensors"
            )
        return x
    if isinstance(x, bool):
        return region.const(x)
    if isinstance(x, numbers.Integral):
        return region.const(int(x))
    if isinstance(x, numbers.Real):
        return region.const(float(x))
    if isinstance(x, ExtraProxy):
        raise AttnFuseError(f"{x!r} is a tensor: index it to read an element (e.g. {x._extra.name}[h])")
    if isinstance(x, _Proxy):
        raise AttnFuseError(f"{x!r} cannot be used inside a custom function")
    raise AttnFuseError(
        f"a {type(x).__name__} cannot be used in a traced function: only traced scalars, Python "
        f"int/float/bool constants and indexed extra tensors of the variant can"
    )


def _to_int(s: Scalar) -> Scalar:
    if s.kind == "int":
        return s
    if s.kind == "bool":
        return Scalar(s.region.emit(arith.ExtUIOp(s.value, i32)), "int", s.region)
    raise AttnFuseError("expected an integer, got a float (there is no implicit float-to-int conversion)")


def _to_float(s: Scalar) -> Scalar:
    if s.kind == "float":
        return s
    i = _to_int(s)
    return Scalar(s.region.emit(arith.SIToFPOp(i.value, f32)), "float", s.region)


def _lift_pair(a: object, b: object, r: _Region, *, floats: bool = False) -> tuple[Scalar, Scalar]:
    """Lift two operands; a Python number meeting a float (or any number when `floats`)
    becomes an f32 constant directly, without an int constant and a conversion."""
    as_float = floats or any(isinstance(x, Scalar) and x.kind == "float" for x in (a, b))

    def one(x: object) -> Scalar:
        if as_float and isinstance(x, numbers.Real) and not isinstance(x, bool):
            return r.const(float(x))
        return _lift(x, r)

    return one(a), one(b)


def _arith(a: object, b: object, int_op: type[Operation] | None, float_op: type[Operation]) -> Scalar:
    r = _current_region("arithmetic on traced values")
    x, y = _lift_pair(a, b, r, floats=int_op is None)
    if int_op is None or x.kind == "float" or y.kind == "float":
        x, y = _to_float(x), _to_float(y)
        return Scalar(r.emit(float_op(x.value, y.value)), "float", r)
    x, y = _to_int(x), _to_int(y)
    return Scalar(r.emit(int_op(x.value, y.value)), "int", r)


def _int_operands(a: object, b: object, op: str) -> tuple[_Region, Scalar, Scalar]:
    r = _current_region(f"{op} on traced values")
    x, y = _lift(a, r), _lift(b, r)
    if x.kind == "float" or y.kind == "float":
        raise AttnFuseError(f"{op} needs integer operands (Python floor semantics on i32), got a float")
    return r, _to_int(x), _to_int(y)


def _floordiv(a: object, b: object) -> Scalar:
    r, x, y = _int_operands(a, b, "//")
    return Scalar(r.emit(arith.FloorDivSIOp(x.value, y.value)), "int", r)


def _mod(a: object, b: object) -> Scalar:
    r, x, y = _int_operands(a, b, "%")
    q = r.emit(arith.FloorDivSIOp(x.value, y.value))
    return Scalar(r.emit(arith.SubiOp(x.value, r.emit(arith.MuliOp(q, y.value)))), "int", r)


def _bitwise(a: object, b: object, op: type[Operation], sym: str) -> Scalar:
    r = _current_region(f"{sym} on traced values")
    x, y = _lift(a, r), _lift(b, r)
    if x.kind == "float" or y.kind == "float":
        raise AttnFuseError(f"{sym} needs booleans or integers, got a float")
    if x.kind == "bool" and y.kind == "bool":
        return Scalar(r.emit(op(x.value, y.value)), "bool", r)
    x, y = _to_int(x), _to_int(y)
    return Scalar(r.emit(op(x.value, y.value)), "int", r)


_CMPI = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}
_CMPF = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}


def _compare(a: object, b: object, pred: str) -> Scalar:
    r = _current_region("comparison of traced values")
    x, y = _lift_pair(a, b, r)
    if x.kind == "float" or y.kind == "float":
        x, y = _to_float(x), _to_float(y)
        return Scalar(r.emit(arith.CmpfOp(x.value, y.value, _CMPF[pred])), "bool", r)
    if not (x.kind == y.kind == "bool" and pred in ("eq", "ne")):
        x, y = _to_int(x), _to_int(y)
    return Scalar(r.emit(arith.CmpiOp(x.value, y.value, _CMPI[pred])), "bool", r)


# --------------------------------------------------------------------------- math functions


def where(cond: object, x: object, y: object) -> Any:
    """`x` where `cond` holds, else `y` (arith.select); int and float operands promote."""
    if not any(isinstance(v, Scalar) for v in (cond, x, y)):
        return x if cond else y
    r = _current_region("af.where")
    c = _lift(cond, r)
    if c.kind != "bool":
        raise AttnFuseError(f"af.where's condition must be a boolean, got a {c.kind}")
    a, b = _lift_pair(x, y, r)
    if a.kind != b.kind:
        if "float" in (a.kind, b.kind):
            a, b = _to_float(a), _to_float(b)
        else:
            a, b = _to_int(a), _to_int(b)
    return Scalar(r.emit(arith.SelectOp(c.value, a.value, b.value)), a.kind, r)


def _unary_math(name: str, op: type[Operation], py: Callable[[float], float]) -> Callable[[Any], Any]:
    def fn(x: Any) -> Any:
        if not isinstance(x, Scalar):
            return py(x)
        r = _current_region(f"af.{name}")
        s = _to_float(_lift(x, r))
        return Scalar(r.emit(op(s.value)), "float", r)

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = f"{name}(x) on a traced float (math.{op.name.split('.')[1]}), or on a Python number."
    return fn


exp = _unary_math("exp", xmath.ExpOp, math.exp)
exp2 = _unary_math("exp2", xmath.Exp2Op, lambda x: 2.0**x)
log = _unary_math("log", xmath.LogOp, math.log)
log2 = _unary_math("log2", xmath.Log2Op, math.log2)
sqrt = _unary_math("sqrt", xmath.SqrtOp, math.sqrt)
rsqrt = _unary_math("rsqrt", xmath.RsqrtOp, lambda x: 1.0 / math.sqrt(x))
tanh = _unary_math("tanh", xmath.TanhOp, math.tanh)
sin = _unary_math("sin", xmath.SinOp, math.sin)
cos = _unary_math("cos", xmath.CosOp, math.cos)


def abs_(x: Any) -> Any:
    """|x| of a traced int (math.absi) or float (math.absf), or of a Python number."""
    if not isinstance(x, Scalar):
        return abs(x)  # type: ignore[arg-type]
    r = _current_region("af.abs")
    s = _lift(x, r)
    if s.kind == "float":
        return Scalar(r.emit(xmath.AbsFOp(s.value)), "float", r)
    s = _to_int(s)
    return Scalar(r.emit(xmath.AbsIOp(s.value)), "int", r)


def _minmax(name: str, int_op: type[Operation], float_op: type[Operation], py: Callable[..., Any]):
    def fn(x: Any, y: Any) -> Any:
        if not isinstance(x, Scalar) and not isinstance(y, Scalar):
            return py(x, y)
        return _arith(x, y, int_op, float_op)

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = f"{name}(x, y) of traced values (ints stay ints, else floats), or of Python numbers."
    return fn


minimum = _minmax("minimum", arith.MinSIOp, arith.MinimumfOp, min)
maximum = _minmax("maximum", arith.MaxSIOp, arith.MaximumfOp, max)


def sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x))."""
    if not isinstance(x, Scalar):
        return 1.0 / (1.0 + math.exp(-x))
    s = _to_float(_lift(x, _current_region("af.sigmoid")))
    return 1.0 / (1.0 + exp(-s))


# --------------------------------------------------------------------------- predicates and biases


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


class MaskPredicate:
    """A mask predicate: `af.causal`, `af.sliding_window(w)`, `af.prefix_lm(n)`,
    `af.document(ids)`, a conjunction `p & q`, or a custom `fn(b, h, q_idx, kv_idx)`.

    Named predicates become named `attn.mask` forms (which `causal-split` recognises);
    `p & q` applies both masks; `p | q` and `~p` become custom regions. A predicate is
    also callable on traced (b, h, q_idx, kv_idx), to be combined inside a custom one."""

    def conjuncts(self) -> list[MaskPredicate]:
        return [self]

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        raise NotImplementedError

    def __and__(self, other: object) -> MaskPredicate:
        return _AllOf([*self.conjuncts(), *_as_predicate(other).conjuncts()])

    def __rand__(self, other: object) -> MaskPredicate:
        return _AllOf([*_as_predicate(other).conjuncts(), *self.conjuncts()])

    def __or__(self, other: object) -> MaskPredicate:
        o = _as_predicate(other)
        return CustomMask(lambda b, h, q, kv: self(b, h, q, kv) | o(b, h, q, kv), f"({self} | {o})")

    def __ror__(self, other: object) -> MaskPredicate:
        return _as_predicate(other) | self

    def __invert__(self) -> MaskPredicate:
        return CustomMask(lambda b, h, q, kv: ~self(b, h, q, kv), f"~{self}")


class NamedMask(MaskPredicate):
    """One of the named `attn.mask` forms."""

    def __init__(self, kind: str, param: int | None = None, extra: ExtraProxy | None = None):
        self.kind, self.param, self.extra = kind, param, extra

    def __repr__(self) -> str:
        if self.kind == "causal":
            return "af.causal"
        arg = self.param if self.extra is None else self.extra._extra.name
        return f"af.{self.kind}({arg})"

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.kind == "causal":
            return kv_idx <= q_idx
        if self.kind == "sliding_window":
            d = q_idx - kv_idx
            return (d >= 0) & (d < self.param)
        if self.kind == "prefix_lm":
            return (kv_idx < self.param) | (kv_idx <= q_idx)
        assert self.extra is not None
        return self.extra[b, q_idx] == self.extra[b, kv_idx]


class CustomMask(MaskPredicate):
    """A Python predicate traced into a `custom` `attn.mask` region."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "predicate")

    def __repr__(self) -> str:
        return self.name

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return self.fn(b, h, q_idx, kv_idx)


class _AllOf(MaskPredicate):
    def __init__(self, preds: list[MaskPredicate]):
        self.preds = preds

    def __repr__(self) -> str:
        return " & ".join(map(repr, self.preds))

    def conjuncts(self) -> list[MaskPredicate]:
        return list(self.preds)

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        result = self.preds[0](b, h, q_idx, kv_idx)
        for p in self.preds[1:]:
            result = result & p(b, h, q_idx, kv_idx)
        return result


def _as_predicate(p: object) -> MaskPredicate:
    if isinstance(p, MaskPredicate):
        return p
    if callable(p) and not isinstance(p, _Proxy):
        return CustomMask(p)
    raise AttnFuseError(
        f"a mask predicate must be af.causal, af.sliding_window(w), af.prefix_lm(n), af.document(ids) "
        f"or a callable fn(b, h, q_idx, kv_idx) returning a boolean, got {_describe(p)}"
    )


def _int_param(x: object, what: str, minimum: int) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or int(x) < minimum:
        raise AttnFuseError(f"{what} must be an integer >= {minimum}, got {x!r}")
    return int(x)


def _extra_arg(x: object, what: str) -> ExtraProxy:
    if isinstance(x, ExtraProxy):
        return x
    if isinstance(x, torch.Tensor):
        raise AttnFuseError(
            f"{what} must be a tensor argument of the variant (passed at call time, like "
            f"variant(q, k, v, {what.split()[-1]})), not a tensor captured from outside"
        )
    raise AttnFuseError(f"{what} must be a tensor argument of the variant, got {_describe(x)}")


causal = NamedMask("causal")
"""Keep kv_pos <= q_pos."""


def sliding_window(w: int) -> MaskPredicate:
    """Keep 0 <= q_pos - kv_pos < w (a causal window of w tokens, the query's own included)."""
    return NamedMask("sliding_window", _int_param(w, "af.sliding_window(w)", 1))


def prefix_lm(n: int) -> MaskPredicate:
    """Keep kv_pos < n (the bidirectional prefix) or kv_pos <= q_pos."""
    return NamedMask("prefix_lm", _int_param(n, "af.prefix_lm(n)", 0))


def document(ids: object) -> MaskPredicate:
    """Keep ids[b, q_pos] == ids[b, kv_pos]: packed documents attend only within
    themselves. `ids` is an integer tensor [B, Nk], an argument of the variant."""
    return NamedMask("document", extra=_extra_arg(ids, "af.document ids"))


class BiasFn:
    """A score bias: `af.alibi(slopes)` or a custom `fn(b, h, q_idx, kv_idx)`."""

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        raise NotImplementedError


class _Alibi(BiasFn):
    def __init__(self, slopes: ExtraProxy):
        self.slopes = slopes

    def __repr__(self) -> str:
        return f"af.alibi({self.slopes._extra.name})"

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return self.slopes[h] * (kv_idx - q_idx)


def alibi(slopes: object) -> BiasFn:
    """ALiBi: add slopes[h] * (kv_pos - q_pos); `slopes` is a float tensor [Hq], an
    argument of the variant (see `af.alibi_slopes`)."""
    return _Alibi(_extra_arg(slopes, "af.alibi slopes"))


# --------------------------------------------------------------------------- rope scaling


_HF_PARAM_NAMES = {"original_max_position_embeddings": "original_max_position"}
_IGNORED_KEYS = {"type", "rope_type"}


def _scaling_attr(kind: str, **params: float | bool | None) -> attn.RopeScalingAttr:
    spec = attn.ROPE_SCALINGS[kind]
    values: dict[str, float | bool] = {}
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(spec.get(k), bool):
            if not isinstance(v, bool):
                raise AttnFuseError(f"{kind} rope scaling parameter {k} must be True or False, got {v!r}")
            values[k] = v
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise AttnFuseError(f"{kind} rope scaling parameter {k} must be a number, got {v!r}")
        values[k] = float(v)
    # Spell out every parameter with a default, so that equal schemes print (and hash) equal.
    for k, default in spec.items():
        if k not in values and default is not None and not (k == "attention_factor" and default == 0.0):
            values[k] = default
    try:
        attr = attn.RopeScalingAttr(kind, **{k: values[k] for k in spec if k in values})
        attr.verify()
    except VerifyException as e:
        raise AttnFuseError(str(e)) from None
    return attr


def linear_scaling(factor: float) -> attn.RopeScalingAttr:
    """Position interpolation: every frequency divided by `factor`."""
    return _scaling_attr("linear", factor=factor)


def llama3_scaling(
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position: float = 8192.0,
) -> attn.RopeScalingAttr:
    """Llama 3.1's scheme: wavelengths longer than original_max_position /
    low_freq_factor are divided by `factor`, shorter than original_max_position /
    high_freq_factor kept, and interpolated smoothly in between."""
    return _scaling_attr(
        "llama3",
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position=original_max_position,
    )


def yarn_scaling(
    factor: float,
    original_max_position: float,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    attention_factor: float | None = None,
    truncate: bool = True,
) -> attn.RopeScalingAttr:
    """YaRN (arXiv 2309.00071): frequencies between beta_fast and beta_slow rotations
    over original_max_position blend interpolation and extrapolation; cos and sin are
    multiplied by attention_factor (default 0.1 * ln(factor) + 1). `truncate` rounds
    the blend's dim range out to whole dims (Hugging Face's default); gpt-oss sets it
    to False."""
    return _scaling_attr(
        "yarn",
        factor=factor,
        original_max_position=original_max_position,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        attention_factor=attention_factor,
        truncate=truncate,
    )


def rope_scaling(scaling: object) -> attn.RopeScalingAttr | None:
    """The `#attn.rope_scaling` of a `scaling=` argument: None, an attribute built by
    the helpers above, or a dict such as a Hugging Face `rope_scaling` config
    (`{"rope_type": "llama3", "factor": 8.0, ...}`; "type" works as well)."""
    if scaling is None or isinstance(scaling, attn.RopeScalingAttr):
        return scaling
    if not isinstance(scaling, dict):
        raise AttnFuseError(
            f"rope scaling must be None, a dict or af.linear_scaling/llama3_scaling/yarn_scaling(...), "
            f"got {_describe(scaling)}"
        )
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind not in attn.ROPE_SCALINGS:
        raise AttnFuseError(f"unknown rope scaling type {kind!r}, expected one of {', '.join(attn.ROPE_SCALINGS)}")
    params: dict[str, Any] = {}
    for k, v in scaling.items():
        if k in _IGNORED_KEYS:
            continue
        name = _HF_PARAM_NAMES.get(k, k)
        if name not in attn.ROPE_SCALINGS[kind]:
            raise AttnFuseError(
                f"{kind} rope scaling has no parameter {k!r}, expected {', '.join(attn.ROPE_SCALINGS[kind])}"
            )
        params[name] = v
    missing = [k for k, d in attn.ROPE_SCALINGS[kind].items() if d is None and k not in params]
    if missing:
        raise AttnFuseError(f"{kind} rope scaling needs {', '.join(missing)}")
    return _scaling_attr(kind, **params)


# --------------------------------------------------------------------------- the ten blocks


def _real(x: object, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise AttnFuseError(f"{what} must be a Python number, got {_describe(x)}")
    return float(x)


def _tensor(x: object, what: str) -> TensorProxy:
    if isinstance(x, TensorProxy) and not x.is_output:
        return x
    if isinstance(x, TensorProxy):
        raise AttnFuseError(f"{what} expects q, k or v, got the output of af.pv")
    raise AttnFuseError(f"{what} expects q, k or v (a tensor argument of the variant), got {_describe(x)}")


def _scores(x: object, what: str) -> ScoresProxy:
    if isinstance(x, ScoresProxy):
        return x
    raise AttnFuseError(f"{what} expects scores (the result of af.qk or a score block), got {_describe(x)}")


def rope(
    x: TensorProxy,
    theta: float = 10000.0,
    style: str = "half",
    rotary_dim: int | None = None,
    scaling: object = None,
    inv_freq: object = None,
) -> TensorProxy:
    """Rotary position embedding of q or k: rotate channel pairs of the first
    `rotary_dim` (default: all) channels by pos * inv_freq[i], inv_freq[i] =
    theta^(-2i/rotary_dim). `style` "half" pairs i with i + rotary_dim/2 (GPT-NeoX,
    Llama), "interleaved" pairs 2i with 2i+1 (GPT-J). `scaling` changes the
    frequencies (see `rope_scaling`); `inv_freq` gives them explicitly as a float
    tensor [rotary_dim / 2] argument of the variant."""
    t = _tracer("af.rope")
    x = _tensor(x, "af.rope")
    r = x.head_dim if rotary_dim is None else _int_param(rotary_dim, "af.rope rotary_dim", 1)
    if style not in attn.RopeOp.STYLES:
        raise AttnFuseError(f"af.rope style must be 'half' or 'interleaved', got {style!r}")
    attr = rope_scaling(scaling)
    freq = None
    if inv_freq is not None:
        if attr is not None:
            raise AttnFuseError("af.rope takes either scaling= or inv_freq=, not both")
        extra = _extra_arg(inv_freq, "af.rope inv_freq")._extra
        extra.require_static((r // 2,), "af.rope inv_freq (rotary_dim / 2 frequencies)")
        freq = extra.value
    op = attn.RopeOp(
        x.value, theta=_real(theta, "af.rope theta"), style=style, rotary_dim=r, scaling=attr, inv_freq=freq
    )
    op.output.name_hint = f"{x.name}_rope"
    return TensorProxy(t.emit(op, "af.rope"), x.name, x.heads, x.head_dim, x.dtype)


def qk_norm(x: TensorProxy, weight: object = None, eps: float = 1e-6) -> TensorProxy:
    """RMS normalisation of q or k over the head dim, times an optional float weight
    [D] (an argument of the variant): x * rsqrt(mean(x^2) + eps) * weight."""
    t = _tracer("af.qk_norm")
    x = _tensor(x, "af.qk_norm")
    w = None
    if weight is not None:
        extra = _extra_arg(weight, "af.qk_norm weight")._extra
        extra.require_static((x.head_dim,), f"af.qk_norm weight of {x.name} (its head dim)")
        w = extra.value
    op = attn.NormOp(x.value, w, _real(eps, "af.qk_norm eps"))
    op.output.name_hint = f"{x.name}_norm"
    return TensorProxy(t.emit(op, "af.qk_norm"), x.name, x.heads, x.head_dim, x.dtype)


def scale(x: TensorProxy | ScoresProxy, c: float) -> Any:
    """Multiply q or k (before af.qk) or the scores (after it) by the constant `c`."""
    t = _tracer("af.scale")
    value = _real(c, "af.scale factor")
    if isinstance(x, ScoresProxy):
        op = attn.ScaleOp(x.value, value)
        op.output.name_hint = "s"
        return ScoresProxy(t.emit(op, "af.scale"), x.heads)
    x = _tensor(x, "af.scale")
    op = attn.ScaleOp(x.value, value)
    op.output.name_hint = f"{x.name}_scale"
    return TensorProxy(t.emit(op, "af.scale"), x.name, x.heads, x.head_dim, x.dtype)


def qk(q: TensorProxy, k: TensorProxy, scale: float | None = None) -> ScoresProxy:
    """Scores q . k^T * scale (default 1/sqrt(head dim)); with GQA query head h reads
    kv head h // (Hq / Hkv)."""
    t = _tracer("af.qk")
    q, k = _tensor(q, "af.qk q"), _tensor(k, "af.qk k")
    op = attn.QKOp(q.value, k.value, None if scale is None else _real(scale, "af.qk scale"))
    op.scores.name_hint = "s"
    return ScoresProxy(t.emit(op, "af.qk"), q.heads)


def mask(s: ScoresProxy, pred: object) -> ScoresProxy:
    """Keep a score where `pred(b, h, q_idx, kv_idx)` holds, else -inf. Masks compose:
    every mask applied must hold."""
    t = _tracer("af.mask")
    s = _scores(s, "af.mask")
    for p in _as_predicate(pred).conjuncts():
        if isinstance(p, NamedMask):
            extras = []
            if p.extra is not None:
                ids = p.extra._extra
                if ids.spec.ndim != 2 or ids.spec.dtype.is_floating_point:
                    raise AttnFuseError(
                        f"af.document ids ({ids.name}) must be an integer tensor [B, Nk], "
                        f"got a {ids.spec.ndim}-d {ids.spec.dtype} tensor"
                    )
                ids.require_dim(0, "eq", "B", "document ids [B, Nk]")
                ids.require_dim(1, "eq", "Nk", "document ids [B, Nk]")
                extras = [ids.value]
            op: Operation = attn.MaskOp(s.value, p.kind, p.param, extras)
        else:
            fn = p.fn if isinstance(p, CustomMask) else p
            region, used = t.trace_region(fn, f"af.mask predicate {p!r}", "mask")
            op = attn.MaskOp(s.value, "custom", None, [e.value for e in used], region)
        op.results[0].name_hint = "s"
        s = ScoresProxy(t.emit(op, "af.mask"), s.heads)
    return s


def bias(s: ScoresProxy, b: object) -> ScoresProxy:
    """Add `b(b, h, q_idx, kv_idx)` to each score: af.alibi(slopes) or a callable."""
    t = _tracer("af.bias")
    s = _scores(s, "af.bias")
    if isinstance(b, _Alibi):
        extra = b.slopes._extra
        extra.require_static((s.heads,), "af.alibi slopes (one per query head)")
        op: Operation = attn.BiasOp(s.value, "alibi", [extra.value])
    elif callable(b) and not isinstance(b, _Proxy):
        name = getattr(b, "__name__", "bias")
        region, used = t.trace_region(b, f"af.bias function {name}", "bias")
        op = attn.BiasOp(s.value, "custom", [e.value for e in used], region)
    else:
        raise AttnFuseError(
            f"af.bias expects af.alibi(slopes) or a callable fn(b, h, q_idx, kv_idx), got {_describe(b)}"
        )
    op.results[0].name_hint = "s"
    return ScoresProxy(t.emit(op, "af.bias"), s.heads)


def softcap(s: ScoresProxy, cap: float) -> ScoresProxy:
    """cap * tanh(s / cap) (Gemma 2, Grok)."""
    t = _tracer("af.softcap")
    s = _scores(s, "af.softcap")
    op = attn.SoftcapOp(s.value, _real(cap, "af.softcap cap"))
    op.output.name_hint = "s"
    return ScoresProxy(t.emit(op, "af.softcap"), s.heads)


def score_mod(s: ScoresProxy, fn: Callable[..., Any]) -> ScoresProxy:
    """Replace each score by fn(score, b, h, q_idx, kv_idx) (flex_attention's score_mod)."""
    t = _tracer("af.score_mod")
    s = _scores(s, "af.score_mod")
    name = getattr(fn, "__name__", "score_mod")
    region, used = t.trace_region(fn, f"af.score_mod function {name}", "score_mod")
    op = attn.ScoreModOp(s.value, [e.value for e in used], region)
    op.output.name_hint = "s"
    return ScoresProxy(t.emit(op, "af.score_mod"), s.heads)


def softmax(s: ScoresProxy, sink: object = None) -> ProbsProxy:
    """Row softmax; a `sink` (float tensor [Hq], an argument of the variant) adds
    exp(sink[h]) to each row's normaliser (gpt-oss)."""
    t = _tracer("af.softmax")
    s = _scores(s, "af.softmax")
    value = None
    if sink is not None:
        extra = _extra_arg(sink, "af.softmax sink")._extra
        extra.require_static((s.heads,), "af.softmax sink (one logit per query head)")
        value = extra.value
    op = attn.SoftmaxOp(s.value, value)
    op.output.name_hint = "p"
    return ProbsProxy(t.emit(op, "af.softmax"), s.heads)


def pv(p: ProbsProxy, v: TensorProxy) -> TensorProxy:
    """out = p . v: [B, Hq, Nq, Dv] in q's dtype; return it from the variant."""
    t = _tracer("af.pv")
    if not isinstance(p, ProbsProxy):
        raise AttnFuseError(f"af.pv expects the result of af.softmax, got {_describe(p)}")
    v = _tensor(v, "af.pv v")
    out_type = TensorType(ELEMENT_TYPES[t.out_dtype], [DYNAMIC_INDEX, p.heads, DYNAMIC_INDEX, v.head_dim])
    op = attn.PVOp(p.value, v.value, out_type)
    op.output.name_hint = "o"
    return TensorProxy(t.emit(op, "af.pv"), "out", p.heads, v.head_dim, t.out_dtype, is_output=True)
