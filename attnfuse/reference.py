"""Reference semantics of the `attn` dialect: an eager PyTorch executor of attn IR.

This module *defines* what every `attn` op means; it is the oracle of every kernel test
and the runtime's CPU fallback, so it stays independent of the Triton lowering. It
walks the variant's `func.func` op by op and materialises the score matrix
`[B, Hq, Nq, Nk]`.

Semantics (the contract the kernels must meet):

- Positions: key/value token j has position j (0..Nk-1), Nk being the sequence length
  of the k operand of `attn.qk`. A tensor of N rows holds the *last* N positions, so
  query row i has position Nk-Nq+i, and `attn.rope` on a tensor of N rows rotates by
  positions Nk-N..Nk-1. Region arguments `q_idx` and `kv_idx` are these positions.
- An `attn.rope` with a `positions` operand rotates row n of batch entry b by
  positions[b, n] ([B, N]) or positions[n] ([N], every batch entry alike) instead, N
  being its input's rows; any integer, negative ones included (they rotate backwards).
  Another shape is an `AttnFuseError`. Only the rotation changes: masks, biases and
  region arguments keep the row-index positions above.
- GQA: query head h reads kv head h // (Hq / Hkv), in `attn.qk` and in `attn.pv`.
- Masks: every `attn.mask` must hold for a score to be kept. A masked score stays
  masked whatever later score ops do to it (kernels may apply masks anywhere), and
  `attn.softmax` sees it as -inf. A row with nothing kept gives p = 0, so out = 0.
  `attn.pv` reads V only at the keys a row keeps: a NaN or Inf in V at a masked key
  (garbage in an unused cache slot) does not reach that row. (Kernels give NaN where a
  row keeps a key whose V is non-finite, in that value's channel; where the value is an
  Inf, the exact sum may be an Inf instead.)
- Sinks: p = exp(s - m) / (exp(sink[h] - m) + sum exp(s - m)), m = max(row max, sink[h]).
- Regions of `custom` masks, biases and score_mods run vectorised over
  [B, H, Nq, Nk]: b is [B,1,1,1], h [1,H,1,1], q_idx [1,1,Nq,1], kv_idx [1,1,1,Nk].
  Integers follow MLIR/Triton semantics: values wrap to their bit width, `divsi` and
  `remsi` truncate toward zero like C (remsi takes the sign of the dividend),
  `floordivsi` rounds down. Floats, whatever
  their IR type (f32, f16...), are computed in `compute_dtype`, so `extf`/`truncf`
  change nothing; a float constant keeps the value its type holds (an f32 0.1 is 0.1
  rounded to f32).
- Integer division by zero is defined, not an error (a GPU cannot raise in a kernel):
  `x divsi 0 = x floordivsi 0 = 0` and `x remsi 0 = x`, so x = (x / y) * y + x % y
  holds for every y.
- `attn.extract` outside the tensor's bounds reads 0 (false for a bool tensor): an
  index below 0 or at least the dimension's size does not wrap around (as a negative
  Python index would) and is not an error. Kernels mask such loads, at no cost for
  in-bounds reads; raising would need a host round trip, and clamping would silently
  read a neighbour. A variant that needs another value outside (e.g. -inf for a
  bias) can compare the index itself, e.g. `where(kv + 1 < n, tab[h, kv + 1], x)`.
- `attn.pv` reads a v of Nk rows (k's length): any other length is an error
  (`AttnFuseError` naming both lengths), as in the runtime's validation of a call.

The executor is differentiable (plain torch ops, no in-place updates), so it can
also serve as the oracle of backward kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    AnyFloat,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    TensorType,
)
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects import attn
from attnfuse.errors import AttnFuseError
from attnfuse.ir import get_func
from attnfuse.low_precision import hadamard_matrix, quantize_e4m3
from attnfuse.reference_regions import REGION_OP_NAMES, REGION_OPS, extract, to_type
from attnfuse.rope_freqs import op_inv_freq

# --------------------------------------------------------------------------- public API


def run_reference(
    ir: ModuleOp | FuncOp | str, *args: torch.Tensor, compute_dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Execute attn IR on `args` (the function's arguments in order: q, k, v, then the
    extra tensors) and return the output `[B, Hq, Nq, Dv]` in `compute_dtype`.

    `ir` is a `builtin.module` holding exactly one `func.func`, the function itself, or
    MLIR text of such a module. Bad IR or arguments raise `AttnFuseError` (a `ValueError`)
    naming the argument or op and what was expected."""
    return run_reference_with_lse(ir, *args, compute_dtype=compute_dtype)[0]


def run_reference_with_lse(
    ir: ModuleOp | FuncOp | str, *args: torch.Tensor, compute_dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `run_reference`, and also return the natural-log log-sum-exp of each score
    row, `[B, Hq, Nq]` in `compute_dtype`, counting the sink term; -inf for a row
    with every score masked and no sink."""
    if not (isinstance(compute_dtype, torch.dtype) and compute_dtype.is_floating_point):
        raise AttnFuseError(f"compute_dtype must be a floating-point torch.dtype, got {compute_dtype}")
    func = get_func(ir)
    try:
        func.verify()
    except VerifyException as e:
        raise AttnFuseError(f"invalid attn IR in @{func.sym_name.data}:\n{e}") from e
    executor = _Executor(func, args, compute_dtype)
    empty = _without_queries_or_keys(func, executor)
    return executor.run() if empty is None else empty


_Op = TypeVar("_Op", bound=Operation)


def _first(func: FuncOp, cls: type[_Op]) -> _Op:
    """The first op of class `cls` in `func` (the verifier guarantees there is one)."""
    return next(op for op in func.walk() if isinstance(op, cls))


def _without_queries_or_keys(func: FuncOp, ex: _Executor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The result of a call with no queries (Nq = 0) or no keys (Nk = 0), which the row
    reductions cannot take; None for other shapes. `out` is zeros [B, Hq, Nq, Dv], as for
    a row with every score masked, and `lse` what the softmax formula gives an empty row:
    -inf, or sink[h] with a sink. Both stay on the inputs' autograd graph (zero gradients)."""
    qk, softmax, pv = _first(func, attn.QKOp), _first(func, attn.SoftmaxOp), _first(func, attn.PVOp)
    q = qk.q
    while not isinstance(q, BlockArgument):
        q = q.owner.operands[0]  # type: ignore[union-attr]
    b, _, nq, _ = ex.values[q].shape  # type: ignore[attr-defined]
    if nq and ex.nk:
        return None
    _, hq, _, dv = pv.output.type.get_shape()  # type: ignore[attr-defined]
    floats = [x for x in ex.values.values() if isinstance(x, torch.Tensor) and x.is_floating_point()]
    zero = sum((x.flatten()[:0].sum() for x in floats), torch.zeros((), dtype=ex.dtype, device=ex.device))
    out = torch.zeros((b, hq, nq, dv), dtype=ex.dtype, device=ex.device) + zero
    sink = softmax.sink
    if sink is None:
        return out, torch.full((b, hq, nq), float("-inf"), dtype=ex.dtype, device=ex.device) + zero
    return out, ex.values[sink].view(1, hq, 1).expand(b, hq, nq) + zero  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- values


@dataclass
class _Scores:
    """A score matrix: its values and which of them every mask so far keeps."""

    values: torch.Tensor
    """[B, H, Nq, Nk] in the compute dtype."""
    keep: torch.Tensor | None
    """bool, broadcastable to `values`; None when nothing is masked."""


@dataclass
class _Probs:
    """Softmax output and the log-sum-exp of each row."""

    p: torch.Tensor
    """[B, H, Nq, Nk]"""
    lse: torch.Tensor
    """[B, H, Nq]"""
    keep: torch.Tensor | None = None
    """Where the masks keep a score, broadcastable to p (None: everywhere)."""


def _arg_label(func: FuncOp, index: int) -> str:
    hint = func.body.block.args[index].name_hint
    return f"argument {index} (%{hint})" if hint else f"argument {index}"


def _check_args(func: FuncOp, args: Sequence[object]) -> None:
    """Check the arguments against the function type: count, tensor-ness, rank, static
    dims and float/integer element kind."""
    types = func.function_type.inputs.data
    if len(args) != len(types):
        names = ", ".join(f"%{a.name_hint}" if a.name_hint else f"#{a.index}" for a in func.body.block.args)
        raise AttnFuseError(f"@{func.sym_name.data} takes {len(types)} arguments ({names}), got {len(args)}")
    for i, (t, a) in enumerate(zip(types, args, strict=True)):
        label = _arg_label(func, i)
        if not isinstance(t, TensorType):
            raise AttnFuseError(f"{label} has type {t}; the reference executor only takes tensors")
        if not isinstance(a, torch.Tensor):
            raise AttnFuseError(f"{label} must be a torch.Tensor of type {t}, got {type(a).__name__}")
        shape = t.get_shape()
        if a.dim() != len(shape):
            raise AttnFuseError(f"{label} must have rank {len(shape)} ({t}), got shape {list(a.shape)}")
        for d, (want, got) in enumerate(zip(shape, a.shape, strict=True)):
            if want != DYNAMIC_INDEX and want != got:
                raise AttnFuseError(f"{label} must have size {want} in dim {d} ({t}), got shape {list(a.shape)}")
        if isinstance(t.get_element_type(), AnyFloat) != a.is_floating_point():
            kind = "a floating-point" if isinstance(t.get_element_type(), AnyFloat) else "an integer"
            raise AttnFuseError(f"{label} must be {kind} tensor ({t}), got dtype {a.dtype}")


def _key_length(func: FuncOp, args: Sequence[torch.Tensor]) -> int:
    """Nk: the rows of the tensor `attn.qk` reads as k, traced back to its argument."""
    qks = [op for op in func.walk() if isinstance(op, attn.QKOp)]
    if len(qks) != 1:
        raise AttnFuseError(f"@{func.sym_name.data} must contain exactly one attn.qk, found {len(qks)}")
    value = qks[0].k
    while not isinstance(value, BlockArgument):
        owner = value.owner
        if not isinstance(owner, attn.PRE_MATMUL_OPS):
            found = owner.name if isinstance(owner, Operation) else "a block argument"
            raise AttnFuseError(
                f"attn.qk k must be a function argument transformed only by attn.rope, attn.norm "
                f"or attn.scale, found {found}"
            )
        value = owner.operands[0]
    return args[value.index].shape[2]


# --------------------------------------------------------------------------- the executor


class _Executor:
    """Runs one function on concrete tensors; `values` maps each SSA value to its data."""

    def __init__(self, func: FuncOp, args: Sequence[torch.Tensor], dtype: torch.dtype):
        _check_args(func, args)
        self.func = func
        self.dtype = dtype
        self.device = args[0].device if args else torch.device("cpu")
        self.nk = _key_length(func, args)
        # Tensors, and the _Scores / _Probs of the score ops: a heterogeneous environment.
        self.values: dict[SSAValue, Any] = {}
        for block_arg, a in zip(func.body.block.args, args, strict=True):
            self.values[block_arg] = self._load(a)

    def _load(self, a: torch.Tensor) -> torch.Tensor:
        """Floats in the compute dtype, integers as int64, bools as they are."""
        if a.is_floating_point():
            return a.to(device=self.device, dtype=self.dtype)
        if a.dtype == torch.bool:
            return a.to(device=self.device)
        return a.to(device=self.device, dtype=torch.int64)

    def run(self) -> tuple[torch.Tensor, torch.Tensor]:
        for op in self.func.body.block.ops:
            if isinstance(op, ReturnOp):
                return self._return(op)
            handler = self.HANDLERS.get(type(op))
            if handler is None:
                raise AttnFuseError(
                    f"the reference executor does not support '{op.name}' in a function body; "
                    f"expected attn ops ending in func.return"
                )
            self.values[op.results[0]] = handler(self, op)
        raise AttnFuseError(f"@{self.func.sym_name.data} has no func.return")

    def _return(self, op: ReturnOp) -> tuple[torch.Tensor, torch.Tensor]:
        if len(op.arguments) != 1 or not isinstance(op.arguments[0].owner, attn.PVOp):
            raise AttnFuseError(f"@{self.func.sym_name.data} must return exactly one value, the result of attn.pv")
        pv = op.arguments[0].owner
        probs = self.values[pv.p]
        assert isinstance(probs, _Probs)
        return self.values[pv.output], probs.lse

    def _scores(self, value: SSAValue) -> _Scores:
        s = self.values[value]
        assert isinstance(s, _Scores)
        return s

    def _positions(self, nq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Query positions [Nq, 1] and key positions [1, Nk], int64."""
        q_pos = torch.arange(self.nk - nq, self.nk, device=self.device).view(nq, 1)
        kv_pos = torch.arange(self.nk, device=self.device).view(1, self.nk)
        return q_pos, kv_pos

    # ----------------------------------------------------------------------- pre-matmul

    def _rope(self, op: attn.RopeOp) -> torch.Tensor:
        x = self.values[op.input]
        r = op.rotary_dim.value.data
        if op.inv_freq is not None:
            inv_freq, magnitude = self.values[op.inv_freq].to(torch.float64), 1.0
        else:
            freqs, magnitude = op_inv_freq(op)
            inv_freq = torch.tensor(freqs, dtype=torch.float64)
        angle = self._rope_positions(op, x)[..., None] * inv_freq.to(self.device)
        cos = (torch.cos(angle) * magnitude).to(self.dtype)
        sin = (torch.sin(angle) * magnitude).to(self.dtype)
        rot, rest = x[..., :r], x[..., r:]
        if op.style.data == "half":
            x1, x2 = rot[..., : r // 2], rot[..., r // 2 :]
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        return torch.cat([out, rest], dim=-1)

    def _rope_positions(self, op: attn.RopeOp, x: torch.Tensor) -> torch.Tensor:
        """The position of each row of `x` [B, H, N, D], float64 and broadcastable to
        [B, 1, N]: Nk-N..Nk-1 [N], or the `positions` operand ([N], or [B, N] as [B, 1, N])."""
        b, n = x.shape[0], x.shape[2]
        if op.positions is None:
            return torch.arange(self.nk - n, self.nk, dtype=torch.float64, device=self.device)
        pos = self.values[op.positions]
        want = [b, n] if pos.dim() == 2 else [n]
        if list(pos.shape) != want:
            expected = f"[B, N] = {want}" if pos.dim() == 2 else f"[N] = {want}"
            raise AttnFuseError(
                f"attn.rope positions must have shape {expected} (N: the rows of its input, shape "
                f"{list(x.shape)}), got {list(pos.shape)}"
            )
        pos = pos.to(torch.float64)
        return pos[:, None, :] if pos.dim() == 2 else pos

    def _norm(self, op: attn.NormOp) -> torch.Tensor:
        x = self.values[op.input]
        y = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + op.eps.value.data)
        if op.weight is not None:
            y = y * self.values[op.weight]
        return y

    def _hadamard(self, op: attn.HadamardOp) -> torch.Tensor:
        x = self.values[op.input]
        return x @ hadamard_matrix(x.shape[-1], op.seed.value.data, x.dtype, x.device)

    def _quantize(self, op: attn.QuantizeOp) -> torch.Tensor:
        return quantize_e4m3(self.values[op.input], op.block.value.data)

    def _scale(self, op: attn.ScaleOp) -> torch.Tensor | _Scores:
        c = op.value.value.data
        x = self.values[op.input]
        if isinstance(x, _Scores):
            return _Scores(x.values * c, x.keep)
        return x * c

    # ----------------------------------------------------------------------- matmuls

    def _qk(self, op: attn.QKOp) -> _Scores:
        q, k = self.values[op.q], self.values[op.k]
        if q.shape[0] != k.shape[0]:
            raise AttnFuseError(f"attn.qk: q has batch {q.shape[0]} but k has batch {k.shape[0]}")
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return _Scores(q @ k.transpose(-1, -2) * op.effective_scale, None)

    def _pv(self, op: attn.PVOp) -> torch.Tensor:
        probs = self.values[op.p]
        assert isinstance(probs, _Probs)
        p, v = probs.p, self.values[op.v]
        if v.shape[0] != p.shape[0] or v.shape[2] != p.shape[3]:
            raise AttnFuseError(
                f"attn.pv: v has {v.shape[2]} rows (dim 2) and batch {v.shape[0]} but k has {p.shape[3]} rows "
                f"and batch {p.shape[0]}: v must have k's length and batch, got shape {list(v.shape)}"
            )
        v = v.repeat_interleave(p.shape[1] // v.shape[1], dim=1)
        if probs.keep is None or bool(torch.isfinite(v).all()):
            return p @ v
        # A masked key is not read: its V, NaN or Inf included, adds nothing (0 * NaN would).
        terms = torch.where(probs.keep[..., None], p[..., None] * v[:, :, None], 0.0)
        return terms.sum(dim=-2)

    # ----------------------------------------------------------------------- score ops

    def _mask(self, op: attn.MaskOp) -> _Scores:
        s = self._scores(op.input)
        kind = op.kind.data
        q_pos, kv_pos = self._positions(s.values.shape[2])
        if kind == "causal":
            keep = kv_pos <= q_pos
        elif kind == "sliding_window":
            dist = q_pos - kv_pos
            keep = (dist >= 0) & (dist < cast(IntegerAttr, op.param).value.data)
        elif kind == "prefix_lm":
            keep = (kv_pos < cast(IntegerAttr, op.param).value.data) | (kv_pos <= q_pos)
        elif kind == "document":
            keep = self._document(op, s, q_pos, kv_pos)
        else:
            keep = self._region(op, s)
        return _Scores(s.values, keep if s.keep is None else s.keep & keep)

    def _document(self, op: attn.MaskOp, s: _Scores, q_pos: torch.Tensor, kv_pos: torch.Tensor) -> torch.Tensor:
        ids = self.values[op.extras[0]]
        b, nq = s.values.shape[0], s.values.shape[2]
        if tuple(ids.shape) != (b, self.nk):
            raise AttnFuseError(
                f"attn.mask document ids must have shape [B, Nk] = [{b}, {self.nk}], got {list(ids.shape)}"
            )
        if nq > self.nk:
            raise AttnFuseError(f"attn.mask document needs Nq <= Nk, got Nq = {nq}, Nk = {self.nk}")
        q_ids = ids[:, q_pos[:, 0]]  # [B, Nq]
        return (q_ids[:, :, None] == ids[:, None, :])[:, None]

    def _bias(self, op: attn.BiasOp) -> _Scores:
        s = self._scores(op.input)
        if op.kind.data == "alibi":
            q_pos, kv_pos = self._positions(s.values.shape[2])
            slopes = self.values[op.extras[0]]
            bias = slopes.view(1, -1, 1, 1) * (kv_pos - q_pos).to(self.dtype)
        else:
            bias = self._region(op, s)
        return _Scores(s.values + bias, s.keep)

    def _softcap(self, op: attn.SoftcapOp) -> _Scores:
        s = self._scores(op.input)
        cap = op.cap.value.data
        return _Scores(cap * torch.tanh(s.values / cap), s.keep)

    def _score_mod(self, op: attn.ScoreModOp) -> _Scores:
        s = self._scores(op.input)
        return _Scores(torch.broadcast_to(self._region(op, s), s.values.shape), s.keep)

    def _softmax(self, op: attn.SoftmaxOp) -> _Probs:
        s = self._scores(op.input)
        x = s.values if s.keep is None else torch.where(s.keep, s.values, float("-inf"))
        m = x.amax(dim=-1, keepdim=True)
        sink = None
        if op.sink is not None:
            sink = self.values[op.sink].view(1, -1, 1, 1)
            m = torch.maximum(m, sink)
        m = torch.where(torch.isneginf(m), 0.0, m)  # a fully masked row: exp gives zeros
        e = torch.exp(x - m)
        denom = e.sum(dim=-1, keepdim=True)
        if sink is not None:
            denom = denom + torch.exp(sink - m)
        p = e / torch.where(denom == 0, 1.0, denom)  # only an empty row's 0: a NaN stays NaN
        if s.keep is not None:  # exactly 0 where masked, also in a row a NaN score made NaN
            p = torch.where(s.keep, p, 0.0)
        lse = (m + torch.log(denom)).squeeze(-1)
        return _Probs(p, lse, s.keep)

    # ----------------------------------------------------------------------- regions

    def _region(self, op: attn.MaskOp | attn.BiasOp | attn.ScoreModOp, s: _Scores) -> torch.Tensor:
        """Run a custom region over every (b, h, q_idx, kv_idx) at once; its value,
        broadcastable to [B, H, Nq, Nk]."""
        block: Block = op.body.block
        b, h, nq, nk = s.values.shape
        q_pos, kv_pos = self._positions(nq)
        env: dict[SSAValue, torch.Tensor] = {}
        args = list(block.args)
        if op.HAS_SCORE_ARG:
            env[args.pop(0)] = s.values
        env[args[0]] = torch.arange(b, device=self.device).view(b, 1, 1, 1)
        env[args[1]] = torch.arange(h, device=self.device).view(1, h, 1, 1)
        env[args[2]] = q_pos.view(1, 1, nq, 1)
        env[args[3]] = kv_pos.view(1, 1, 1, nk)
        for block_arg, extra in zip(args[4:], op.extras, strict=True):
            env[block_arg] = self.values[extra]
        for inner in block.ops:
            if isinstance(inner, attn.YieldOp):
                return env[inner.values[0]]
            env[inner.results[0]] = self._region_op(inner, env, op)
        raise AttnFuseError(f"{op.name} region has no attn.yield")

    def _region_op(self, inner: Operation, env: dict[SSAValue, torch.Tensor], parent: Operation) -> torch.Tensor:
        if isinstance(inner, attn.ExtractOp):
            result = extract(inner, [env[v] for v in inner.operands])
        elif inner.name == "arith.constant":
            result = self._constant(inner)
        else:
            fn = REGION_OPS.get(inner.name)
            if fn is None or inner.regions or len(inner.results) != 1:
                raise AttnFuseError(
                    f"the reference executor does not support '{inner.name}' in a {parent.name} "
                    f"region; supported: {', '.join(sorted(REGION_OP_NAMES))}"
                )
            result = fn(inner, [env[v] for v in inner.operands])
        return to_type(result, inner.results[0].type, self.dtype)

    def _constant(self, op: Operation) -> torch.Tensor:
        value = op.properties["value"]
        if isinstance(value, IntegerAttr):
            return torch.tensor(value.value.data, dtype=torch.int64, device=self.device)
        if isinstance(value, FloatAttr):
            return torch.tensor(value.value.data, dtype=self.dtype, device=self.device)
        raise AttnFuseError(f"the reference executor supports only scalar arith.constant, got {value}")

    HANDLERS: dict[type[Operation], Callable[[_Executor, Any], object]] = {
        attn.RopeOp: _rope,
        attn.NormOp: _norm,
        attn.HadamardOp: _hadamard,
        attn.QuantizeOp: _quantize,
        attn.ScaleOp: _scale,
        attn.QKOp: _qk,
        attn.MaskOp: _mask,
        attn.BiasOp: _bias,
        attn.SoftcapOp: _softcap,
        attn.ScoreModOp: _score_mod,
        attn.SoftmaxOp: _softmax,
        attn.PVOp: _pv,
    }


# --------------------------------------------------------------------------- a chain alone


class _ChainExecutor(_Executor):
    """Runs the pre-matmul ops of one operand (K's chain, for `Variant.cache_keys`), every
    RoPE of it at the given positions instead of its own."""

    def __init__(self, values: Mapping[SSAValue, torch.Tensor], positions: torch.Tensor, dtype: torch.dtype):
        self.dtype = dtype
        self.device = positions.device
        self.positions = positions
        self.values = {a: self._load(t) for a, t in values.items()}

    def _rope_positions(self, op: attn.RopeOp, x: torch.Tensor) -> torch.Tensor:
        pos = self.positions.to(torch.float64)
        return pos[:, None, :] if pos.dim() == 2 else pos


def run_chain(
    chain: Sequence[Operation],
    values: Mapping[SSAValue, torch.Tensor],
    positions: torch.Tensor,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The result of the pre-matmul ops `chain` (attn.rope, attn.norm, attn.scale; the first
    reads a function argument), every RoPE at `positions` ([N] or [B, N], N the rows of its
    input), in `compute_dtype`. `values` gives the function arguments the ops read: the
    operand and the extra tensors (QK-norm weights, inv_freq)."""
    ex = _ChainExecutor(values, positions, compute_dtype)
    out = None
    for op in chain:
        out = ex.values[op.results[0]] = ex.HANDLERS[type(op)](ex, op)
    assert isinstance(out, torch.Tensor)
    return out
