"""Scalars: the values a custom mask, bias or score_mod function computes with.

A custom function `fn(b, h, q_idx, kv_idx)` (or `fn(score, b, h, q_idx, kv_idx)`) is
traced into the region of its `attn` op (`_Region`): its arguments are `Scalar`
proxies, and Python arithmetic, comparisons and the `af.*` math functions on them
append `arith`/`math` ops to the region. The typing rules (i32/f32/i1, promotion,
Python floor semantics of `//` and `%`) are listed in the package docstring
(`attnfuse.dsl`).

This is the bottom module of the front end: it holds the base of every symbolic
value (`_Proxy`) and reads the thread's tracing state (`_local`), and imports no other
`attnfuse.dsl` module at run time; `tracing` builds on it.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xdsl.dialects import arith
from xdsl.dialects import math as xmath
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, f32, i1, i32
from xdsl.ir import Attribute, Block, BlockArgument, Operation, SSAValue

from attnfuse.errors import AttnFuseError

if TYPE_CHECKING:
    from attnfuse.dsl.tracing import _Extra

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
"""The range of i32, the type of integers (positions, indices, constants) in kernels."""

_F32_MAX = 3.4028234663852886e38
"""The largest finite f32: a float constant or parameter beyond it is infinite in a kernel."""

# --------------------------------------------------------------------------- tracing state

_local = threading.local()
"""The thread's tracing state: `_local.tracer` is the `_Tracer` (attnfuse.dsl.tracing)
of the variant being traced, or absent; its `region` is the `_Region` of the custom
function being traced inside it, or None."""


BinaryOpType = Callable[[SSAValue, SSAValue], Operation]
"""An arith op class, as a constructor of the op from its two operands."""


def _current_region(what: str) -> _Region:
    t = getattr(_local, "tracer", None)
    region = t.region if t is not None else None
    if region is None:
        raise AttnFuseError(
            f"{what} is only meaningful inside a custom mask, bias or score_mod function "
            f"(fn(b, h, q_idx, kv_idx) or fn(score, b, h, q_idx, kv_idx)) being traced"
        )
    return region


# --------------------------------------------------------------------------- symbolic values


def _describe(x: object) -> str:
    if isinstance(x, _Proxy):
        return repr(x)
    return f"a {type(x).__name__}"


def _show(x: object) -> str:
    """A Python value as an error message quotes it: its repr, with its type when that is
    not plain int or float (`True (a bool)`); an integer too long to read by its size."""
    if type(x) is int and x.bit_length() > 64:
        return f"an integer of {x.bit_length()} bits"
    if type(x) in (int, float) or isinstance(x, _Proxy):
        return repr(x)
    return f"{x!r} (a {type(x).__name__})"


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

    def _not_a_scalar(self) -> str:
        """Why this value cannot be used where a custom function needs a scalar."""
        return f"{self!r} cannot be used inside a custom function"


# --------------------------------------------------------------------------- custom-function regions and scalars


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

    def float_const(self, x: numbers.Real) -> Scalar:
        """The f32 constant of the Python number `x`: NaN, an infinity, or a number within
        f32's range (a larger one would silently become infinite)."""
        try:
            value: float | None = float(x)
        except OverflowError:  # an int beyond any float
            value = None
        if value is not None and (not math.isfinite(value) or abs(value) <= _F32_MAX):
            return self.const(value)
        raise AttnFuseError(
            f"float constant {_show(x)} in {self.what} does not fit in f32 (finite values are at most "
            f"{_F32_MAX:.7g} in magnitude)"
        )

    def extra_arg(self, extra: _Extra) -> BlockArgument:
        """The region argument standing for `extra`, added on first use."""
        if extra not in self.extras:
            arg = self.block.insert_arg(extra.value.type, len(self.block.args))
            arg.name_hint = extra.name
            extra.region_args.append(arg)
            self.extras.append(extra)
        return extra.region_args[[r.block for r in extra.region_args].index(self.block)]


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
        return region.float_const(x)
    if isinstance(x, _Proxy):
        raise AttnFuseError(x._not_a_scalar())
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
            return r.float_const(x)
        return _lift(x, r)

    return one(a), one(b)


def _arith(a: object, b: object, int_op: BinaryOpType | None, float_op: BinaryOpType) -> Scalar:
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


def _bitwise(a: object, b: object, op: BinaryOpType, sym: str) -> Scalar:
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


def _unary_math(name: str, op: Callable[[SSAValue], Operation], py: Callable[[float], float]) -> Callable[[Any], Any]:
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


def _minmax(name: str, int_op: BinaryOpType, float_op: BinaryOpType, py: Callable[..., Any]):
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
