"""The reference executor's region ops (`attnfuse.reference`): how each op a custom
mask, bias or score_mod region may hold is computed on tensors, vectorised over
[B, H, Nq, Nk] (the semantics are in `attnfuse.reference`'s docstring).

Integers are int64 tensors holding the signed value of their IR width (bool for i1);
`to_type` wraps every integer result to its width. Floats are computed in the
executor's compute dtype."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from xdsl.dialects.builtin import AnyFloat, IndexType, IntegerAttr, IntegerType
from xdsl.ir import Attribute, Operation

from attnfuse.dialects import attn

__all__ = ["REGION_OPS", "REGION_OP_NAMES", "extract", "to_type"]

_INT64_MIN = -(1 << 63)


def _width(t: Attribute) -> int:
    if isinstance(t, IntegerType):
        return t.width.data
    assert isinstance(t, IndexType), t
    return 64


def _signed(x: torch.Tensor) -> torch.Tensor:
    """The signed value of an integer; an i1 true is -1, as in MLIR."""
    return -x.to(torch.int64) if x.dtype == torch.bool else x


def _zext(x: torch.Tensor, width: int) -> torch.Tensor:
    """The unsigned value of a `width`-bit integer (width < 64)."""
    return x.to(torch.int64) if x.dtype == torch.bool else x & ((1 << width) - 1)


def to_type(x: torch.Tensor, t: Attribute, dtype: torch.dtype) -> torch.Tensor:
    """Represent a region value as its IR type says: wrap integers, cast floats."""
    if isinstance(t, AnyFloat):
        return x.to(dtype)
    width = _width(t)
    if width == 1:
        return x if x.dtype == torch.bool else (x & 1) != 0
    x = _signed(x)
    if width >= 64:
        return x
    half = 1 << (width - 1)
    return torch.remainder(x + half, 1 << width) - half


def _int_binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    return lambda op, a: fn(_signed(a[0]), _signed(a[1]))


def _int_division(rounding: str):
    """divsi ("trunc") or floordivsi ("floor"); x / 0 = 0."""

    def run(op: Operation, a: list[torch.Tensor]) -> torch.Tensor:
        x, y = _signed(a[0]), _signed(a[1])
        by_zero = y == 0
        quotient = torch.div(x, torch.where(by_zero, 1, y), rounding_mode=rounding)
        return torch.where(by_zero, 0, quotient)

    return run


def _remsi(op: Operation, a: list[torch.Tensor]) -> torch.Tensor:
    """x - trunc(x / y) * y, the sign of the dividend (torch.fmod, like C); x % 0 = x."""
    x, y = _signed(a[0]), _signed(a[1])
    by_zero = y == 0
    return torch.where(by_zero, x, torch.fmod(x, torch.where(by_zero, 1, y)))


def _unary(fn: Callable[[torch.Tensor], torch.Tensor]):
    return lambda op, a: fn(a[0])


def _binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    return lambda op, a: fn(a[0], a[1])


def _cmpi(op: Operation, a: list[torch.Tensor]) -> torch.Tensor:
    pred = cast(IntegerAttr, op.properties["predicate"]).value.data
    width = _width(op.operands[0].type)
    if pred >= 6:  # unsigned: compare the zero-extended values
        if width >= 64:  # flipping the sign bit maps unsigned order onto signed order
            x, y = a[0] ^ _INT64_MIN, a[1] ^ _INT64_MIN
        else:
            x, y = _zext(a[0], width), _zext(a[1], width)
    else:
        x, y = _signed(a[0]), _signed(a[1])
    compare = (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge)[pred if pred < 6 else pred - 4]
    return compare(x, y)


def _cmpf(op: Operation, a: list[torch.Tensor]) -> torch.Tensor:
    pred = cast(IntegerAttr, op.properties["predicate"]).value.data
    x, y = a
    unordered = torch.isnan(x) | torch.isnan(y)
    if pred in (0, 15):  # false, true
        return torch.full(torch.broadcast_shapes(x.shape, y.shape), pred == 15, device=x.device)
    if pred == 7:  # ord
        return ~unordered
    if pred == 14:  # uno
        return unordered
    compare = {1: torch.eq, 2: torch.gt, 3: torch.ge, 4: torch.lt, 5: torch.le, 6: torch.ne}
    if pred < 7:  # ordered: false when either side is NaN
        return compare[pred](x, y) & ~unordered
    return compare[pred - 7](x, y) | unordered  # ueq, ugt, uge, ult, ule, une


def _uitofp(op: Operation, a: list[torch.Tensor]) -> torch.Tensor:
    """The unsigned value of the operand, as a float."""
    width = _width(op.operands[0].type)
    if width < 64:
        return _zext(a[0], width).to(torch.float64)
    x = a[0].to(torch.float64)
    return torch.where(a[0] < 0, x + 2.0**64, x)


def extract(op: attn.ExtractOp, a: list[torch.Tensor]) -> torch.Tensor:
    """tensor[indices], 0 (false) where an index is outside its dimension."""
    tensor, indices = a[0], torch.broadcast_tensors(*[_signed(i) for i in a[1:]])
    zero = torch.zeros((), dtype=tensor.dtype, device=tensor.device)
    if not indices:
        return tensor
    inside = torch.ones_like(indices[0], dtype=torch.bool)
    for i, size in zip(indices, tensor.shape, strict=True):
        inside &= (i >= 0) & (i < size)
    if tensor.numel() == 0:
        return zero.expand(inside.shape)
    clamped = tuple(torch.where(inside, i, 0) for i in indices)
    return torch.where(inside, tensor[clamped], zero)


REGION_OPS: dict[str, Callable[[Operation, list[torch.Tensor]], torch.Tensor]] = {
    # integer arithmetic, wrapped to the result width by `to_type`
    "arith.addi": _int_binary(torch.add),
    "arith.subi": _int_binary(torch.sub),
    "arith.muli": _int_binary(torch.mul),
    "arith.divsi": _int_division("trunc"),
    "arith.floordivsi": _int_division("floor"),
    "arith.remsi": _remsi,
    "arith.maxsi": _int_binary(torch.maximum),
    "arith.minsi": _int_binary(torch.minimum),
    "arith.andi": _int_binary(torch.bitwise_and),
    "arith.ori": _int_binary(torch.bitwise_or),
    "arith.xori": _int_binary(torch.bitwise_xor),
    "math.absi": _unary(lambda x: torch.abs(_signed(x))),
    # float arithmetic, in the compute dtype
    "arith.addf": _binary(torch.add),
    "arith.subf": _binary(torch.sub),
    "arith.mulf": _binary(torch.mul),
    "arith.divf": _binary(torch.div),
    "arith.negf": _unary(torch.neg),
    "arith.maximumf": _binary(torch.maximum),
    "arith.minimumf": _binary(torch.minimum),
    "arith.maxnumf": _binary(torch.fmax),  # a NaN operand yields the other one
    "arith.minnumf": _binary(torch.fmin),
    "math.exp": _unary(torch.exp),
    "math.exp2": _unary(torch.exp2),
    "math.log": _unary(torch.log),
    "math.log2": _unary(torch.log2),
    "math.tanh": _unary(torch.tanh),
    "math.sqrt": _unary(torch.sqrt),
    "math.rsqrt": _unary(torch.rsqrt),
    "math.absf": _unary(torch.abs),
    "math.sin": _unary(torch.sin),
    "math.cos": _unary(torch.cos),
    "math.powf": _binary(torch.pow),
    # comparisons and selection
    "arith.cmpi": _cmpi,
    "arith.cmpf": _cmpf,
    "arith.select": lambda op, a: torch.where(a[0], a[1], a[2]),
    # casts
    "arith.sitofp": _unary(_signed),
    "arith.uitofp": _uitofp,
    "arith.fptosi": _unary(lambda x: torch.trunc(x).to(torch.int64)),
    "arith.extsi": _unary(_signed),
    "arith.extui": lambda op, a: _zext(a[0], _width(op.operands[0].type)),
    "arith.trunci": _unary(_signed),
    "arith.index_cast": _unary(_signed),
    "arith.extf": _unary(lambda x: x),
    "arith.truncf": _unary(lambda x: x),
}
"""Interpreters of the ops a custom region may hold, by op name: (op, operand values)
-> result, before `to_type` wraps or casts it to the result type."""

REGION_OP_NAMES = frozenset({"attn.extract", "arith.constant", *REGION_OPS})
"""Every op the executor runs in a region (attn.yield ends it): the dialect's
`attn.REGION_OPS`, checked by python_tests/test_region_ops.py."""
