"""convert-attn-to-tl: lower an annotated attention variant to one fused Triton kernel
(plus, when rope-fusion chose it, a K pre-rotation kernel) and its host launcher.

The kernel is FlashAttention-2's forward: one program per (Q tile, batch x head);
Q's transforms run once in the prologue; the KV loop is split into the segments
causal-split allows (skipped blocks are never visited, full blocks carry no mask
code); the softmax is online and in base 2; fully masked rows give zeros; the
per-row log-sum-exp (natural log) is written for a backward. Head dims that are not
powers of two are padded with masked loads; RoPE splits each head into channel
groups (rotation halves, pass-through part) that meet again only as a sum of dots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import arith, func, math
from xdsl.dialects.builtin import (
    ArrayAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    TensorType,
    f32,
    i1,
    i32,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.dialects.attn import LOG2E, KvBoundAttr, Placement, PlacementAttr
from attnfuse.dialects.tl import RESERVED_NAMES, dtype_name
from attnfuse.passes.analysis import AttentionChains, analyse, variant_funcs
from attnfuse.rope_freqs import op_inv_freq

LN2 = 0.6931471805599453
NEG_INF = float("-inf")

Value = SSAValue | int | float | bool


def _pow2(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


# ----------------------------------------------------------------------------- builder


class KernelBuilder:
    """Appends tl ops to a block; parameters are added to the kernel as they are needed."""

    def __init__(self, params: Params, block: Block):
        self.params = params
        self.block = block

    def _add(self, op: Operation, hint: str | None = None) -> SSAValue:
        self.block.add_op(op)
        if not op.results:
            return None  # type: ignore[return-value]
        if hint:
            op.results[0].name_hint = hint
        return op.results[0]

    def v(self, x: Value, like: Attribute | None = None) -> SSAValue:
        if isinstance(x, SSAValue):
            return x
        if isinstance(x, float) or (like is not None and not isinstance(tl.scalar_of(like), IntegerType)):
            return self._add(tl.ConstantOp(float(x), f32))
        return self._add(tl.ConstantOp(x))

    def binary(self, cls: type[tl.BinaryOp], a: Value, b: Value, hint: str | None = None) -> SSAValue:
        a_v = self.v(a, b.type if isinstance(b, SSAValue) else None)
        b_v = self.v(b, a_v.type)
        return self._add(cls(a_v, b_v), hint)

    def add(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.AddOp, a, b, hint)

    def sub(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.SubOp, a, b, hint)

    def mul(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.MulOp, a, b, hint)

    def div(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.TrueDivOp, a, b, hint)

    def floordiv(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.FloorDivOp, a, b, hint)

    def rem(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.RemOp, a, b, hint)

    def and_(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.AndOp, a, b, hint)

    def or_(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.OrOp, a, b, hint)

    def maximum(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.MaximumOp, a, b, hint)

    def minimum(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.MinimumOp, a, b, hint)

    def cdiv(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.CdivOp, a, b, hint)

    def cmp(self, pred: str, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        a_v = self.v(a, b.type if isinstance(b, SSAValue) else None)
        return self._add(tl.CmpOp(pred, a_v, self.v(b, a_v.type)), hint)

    def where(self, c: SSAValue, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        like = a.type if isinstance(a, SSAValue) else b.type if isinstance(b, SSAValue) else None
        return self._add(tl.WhereOp(c, self.v(a, like), self.v(b, like)), hint)

    def unary(self, cls: type[tl.UnaryOp], x: SSAValue, hint: str | None = None) -> SSAValue:
        return self._add(cls(x), hint)

    def cast(self, x: SSAValue, element: Attribute, hint: str | None = None) -> SSAValue:
        if tl.scalar_of(x.type) == element:
            return x
        return self._add(tl.CastOp(x, element), hint)

    def arange(self, end: Value, hint: str | None = None) -> SSAValue:
        return self._add(tl.ArangeOp(self.v(end)), hint)

    def full(self, dims: Sequence[Value], value: float, element: Attribute, hint: str | None = None):
        return self._add(tl.FullOp([self.v(d) for d in dims], value, element), hint)

    def row(self, x: SSAValue) -> SSAValue:
        """x[:, None]"""
        return self._add(tl.ExpandDimsOp(x, 1))

    def col(self, x: SSAValue) -> SSAValue:
        """x[None, :]"""
        return self._add(tl.ExpandDimsOp(x, 0))

    def reduce(self, kind: str, x: SSAValue, axis: int, hint: str | None = None) -> SSAValue:
        return self._add(tl.ReduceOp(kind, x, axis), hint)

    def load(
        self, ptr: SSAValue, mask: SSAValue | None = None, other: float | None = None, hint: str | None = None
    ) -> SSAValue:
        return self._add(tl.LoadOp(ptr, mask, other if mask is not None else None), hint)

    def store(self, ptr: SSAValue, value: SSAValue, mask: SSAValue | None = None) -> None:
        self.block.add_op(tl.StoreOp(ptr, value, mask))

    def dot(
        self,
        a: SSAValue,
        b: SSAValue,
        acc: SSAValue | None = None,
        precision: str | None = None,
        hint: str | None = None,
    ) -> SSAValue:
        return self._add(tl.DotOp(a, b, acc, precision), hint)

    def loop(
        self,
        lb: Value,
        ub: Value,
        step: Value,
        carried: dict[str, SSAValue],
        body: Callable[[KernelBuilder, SSAValue, dict[str, SSAValue]], dict[str, SSAValue]],
        iv_name: str = "start_n",
    ) -> dict[str, SSAValue]:
        names = list(carried)
        block = Block(arg_types=[i32, *(carried[n].type for n in names)])
        block.args[0].name_hint = iv_name
        for arg, n in zip(block.args[1:], names, strict=True):
            arg.name_hint = n
        inner = KernelBuilder(self.params, block)
        new = body(inner, block.args[0], dict(zip(names, block.args[1:], strict=True)))
        block.add_op(tl.YieldOp(*(new[n] for n in names)))
        op = tl.ForOp(self.v(lb), self.v(ub), self.v(step), [carried[n] for n in names], block)
        self.block.add_op(op)
        for r, n in zip(op.res, names, strict=True):
            r.name_hint = n
        return dict(zip(names, op.res, strict=True))


@dataclass
class Params:
    """A kernel's parameters: block arguments with the host expressions bound to them."""

    block: Block = field(default_factory=Block)
    host: list[str] = field(default_factory=list)
    constexprs: list[int] = field(default_factory=list)
    by_key: dict[str, SSAValue] = field(default_factory=dict)

    def get(self, key: str, type: Attribute, host: str, constexpr: bool = False) -> SSAValue:
        if key not in self.by_key:
            arg = self.block.insert_arg(type, len(self.block.args))
            arg.name_hint = key
            self.host.append(host)
            if constexpr:
                self.constexprs.append(len(self.block.args) - 1)
            self.by_key[key] = arg
        return self.by_key[key]


# ----------------------------------------------------------------------------- rope layout


@dataclass(frozen=True)
class RopeLayout:
    """Which channels RoPE pairs: `half` pairs c with c + R/2, `interleaved` pairs 2i with
    2i + 1; channels from `rotary_dim` on pass through. The kernel keeps whole
    [tokens, head dim] tiles: a rotated tile is x * cos + partner(x) * sign * sin, where
    partner(x) is a second load of the same rows with each channel's pair partner."""

    style: str
    rotary_dim: int


def rope_layout(ropes: Sequence[attn.RopeOp]) -> RopeLayout | None:
    """The single rope layout of a variant (q and k must agree to meet in one dot)."""
    if not ropes:
        return None
    layouts = {(r.style.data, r.rotary_dim.value.data) for r in ropes}
    if len(layouts) > 1:
        raise DiagnosticException(
            "the Triton lowering needs every attn.rope of a variant to share style and rotary_dim, "
            f"got {sorted(layouts)}"
        )
    style, rdim = layouts.pop()
    return RopeLayout(style, rdim)


# ----------------------------------------------------------------------------- lowering


@dataclass
class Tensor4:
    """A `[B, H, N, D]` kernel argument: its pointer and four strides."""

    ptr: SSAValue
    strides: list[SSAValue]


class Lowering:
    """Builds the kernels of one variant."""

    def __init__(self, v: AttentionChains, arg_names: list[str]):
        self.v = v
        self.names = arg_names
        tiling = v.func.attributes.get("attn.tiling")
        if tiling is None:
            raise DiagnosticException(
                f"func @{v.func.sym_name.data} has no attn.tiling: run the tiling pass before convert-attn-to-tl"
            )
        t = {k: a.value.data for k, a in tiling.data.items() if isinstance(a, IntegerAttr)}  # type: ignore[attr-defined]
        self.block_m, self.block_n = t["block_m"], t["block_n"]
        self.num_warps, self.num_stages = t["num_warps"], t["num_stages"]
        qs, ks, vs = v.q_type.get_shape(), v.k_type.get_shape(), v.v_type.get_shape()
        self.hq, self.hkv, self.d, self.dv = qs[1], ks[1], qs[3], vs[3]
        self.dtype = v.q_type.get_element_type()
        self.kdtype = v.k_type.get_element_type()
        self.vdtype = v.v_type.get_element_type()
        self.dpad = _pow2(self.d)
        self.layout = rope_layout(v.ropes())
        if (
            sum(isinstance(op, attn.RopeOp) for op in v.q_chain) > 1
            or sum(isinstance(op, attn.RopeOp) for op in v.k_chain) > 1
        ):
            raise DiagnosticException("the Triton lowering applies at most one attn.rope to q and to k")
        self.k_placement: Placement | None = None
        """Where K's transforms run (rope-fusion's placement; without it, in the KV loop)."""
        for op in v.k_chain:
            placement = op.attributes.get("placement")
            self.k_placement = placement.data if isinstance(placement, PlacementAttr) else Placement.KV_LOOP
        prescale = v.qk.attributes.get("q_prescale")
        self.q_prescale = prescale.value.data if isinstance(prescale, FloatAttr) else v.qk.effective_scale
        self.log2e_folded = v.qk.log2e_folded
        self.kv_bounds = kv_bounds(v)
        self.precision = "ieee" if self.dtype == f32 else None
        self.tables: dict[str, tuple[list[float], float]] = {}

    # ------------------------------------------------------------------ parameters
    def arg_index(self, value: SSAValue) -> int:
        assert isinstance(value, BlockArgument)
        return value.index

    def tensor(self, p: Params, value: SSAValue, key: str | None = None, host: str | None = None) -> Tensor4:
        """Pointer and strides of a function argument (or of `host`, a tensor like it)."""
        i = self.arg_index(value)
        name = host or self.names[i]
        t = value.type
        assert isinstance(t, TensorType)
        key = key or name
        ptr = p.get(key, tl.PointerType(t.get_element_type()), name)
        strides = [p.get(f"stride_{key}_{d}", i32, f"{name}.stride({d})") for d in range(len(t.get_shape()))]
        return Tensor4(ptr, strides)

    def rope_tables(self, p: Params, op: attn.RopeOp) -> tuple[SSAValue, SSAValue]:
        """Pointers to the host-built [positions, rotary_dim / 2] cos and sin tables of a rope
        given by theta and scaling (no sin/cos in the kernel: it would cost more than a load)."""
        freqs, magnitude = op_inv_freq(op)
        entry = ([float(x) for x in freqs], magnitude)
        key = next((k for k, e in self.tables.items() if e == entry), f"rope_{len(self.tables)}")
        self.tables[key] = entry
        return (
            p.get(f"{key}_cos", tl.PointerType(f32), f"{key}_cos"),
            p.get(f"{key}_sin", tl.PointerType(f32), f"{key}_sin"),
        )

    # ------------------------------------------------------------------ pre-matmul chains
    def channels(self, kb: KernelBuilder) -> tuple[SSAValue, SSAValue | None]:
        """(channel index tile [D padded], each channel's RoPE partner or None)."""
        offs_d = kb.arange(self.dpad, hint="offs_d")
        layout = self.layout
        if layout is None:
            return offs_d, None
        r, half = layout.rotary_dim, layout.rotary_dim // 2
        if layout.style == "half":
            partner = kb.where(
                kb.cmp("<", offs_d, half),
                kb.add(offs_d, half),
                kb.where(kb.cmp("<", offs_d, r), kb.sub(offs_d, half), offs_d),
            )
        else:
            partner = kb.where(kb.cmp("<", offs_d, r), kb.binary(tl.XorOp, offs_d, 1), offs_d)
        kb.block.last_op.results[0].name_hint = "partner_d"  # type: ignore[union-attr]
        return offs_d, partner

    def load_tile(
        self,
        kb: KernelBuilder,
        base: SSAValue,
        tok_offs: SSAValue,
        tok_ok: SSAValue | None,
        tok_stride: SSAValue,
        chan_stride: SSAValue,
        chans: SSAValue,
        tokens_first: bool,
        hint: str,
    ) -> SSAValue:
        """Load a [tokens, head dim] tile (or its transpose), masked where out of range."""
        tok_axis, chan_axis = (kb.row, kb.col) if tokens_first else (kb.col, kb.row)
        ptr = kb.add(
            kb.add(base, kb.mul(tok_axis(tok_offs), tok_stride)),
            kb.mul(chan_axis(chans), chan_stride),
            hint=f"{hint}_ptr",
        )
        mask = tok_axis(tok_ok) if tok_ok is not None else None
        if self.dpad != self.d:
            cmask = chan_axis(kb.cmp("<", chans, self.d))
            mask = cmask if mask is None else kb.and_(mask, cmask)
        return kb.load(ptr, mask, 0.0, hint=hint)

    def transformed(
        self,
        kb: KernelBuilder,
        p: Params,
        ops: Sequence[Operation],
        load,
        pos: SSAValue,
        tok_ok: SSAValue | None,
        tokens_first: bool,
        prefix: str,
    ) -> SSAValue:
        """Load a q/k tile with `load(channels)` and apply rope/norm/scale in fp32.

        Before a rope, the pair partners (a second, permuted load) go through the same
        ops, so the rotation needs no data movement between channels."""
        offs_d, partner_d = self.channels(kb)
        x = kb.cast(load(offs_d), f32)
        has_rope = any(isinstance(op, attn.RopeOp) for op in ops)
        xp = kb.cast(load(partner_d), f32) if has_rope and partner_d is not None else None
        tok_axis, chan_axis = (kb.row, kb.col) if tokens_first else (kb.col, kb.row)
        chan_dim = 1 if tokens_first else 0
        for op in ops:
            if isinstance(op, attn.ScaleOp):
                x = kb.mul(x, op.value.value.data)
                xp = kb.mul(xp, op.value.value.data) if xp is not None else None
            elif isinstance(op, attn.NormOp):
                total = kb.reduce("sum", kb.mul(x, x), chan_dim)
                r = tok_axis(
                    kb.unary(tl.RsqrtOp, kb.add(kb.div(total, float(self.d)), op.eps.value.data), hint=f"{prefix}_rstd")
                )
                x = kb.mul(x, r, hint=f"{prefix}_normed")
                xp = kb.mul(xp, r) if xp is not None else None
                if op.weight is not None:
                    w = self.tensor(p, op.weight)
                    dmask = kb.cmp("<", offs_d, self.d) if self.dpad != self.d else None

                    def weight(chans: SSAValue, w=w, dmask=dmask) -> SSAValue:
                        wt = kb.load(kb.add(w.ptr, kb.mul(chans, w.strides[0])), dmask, 0.0)
                        return chan_axis(kb.cast(wt, f32))

                    x = kb.mul(x, weight(offs_d), hint=f"{prefix}_weighted")
                    xp = kb.mul(xp, weight(partner_d)) if xp is not None and partner_d is not None else None
            elif isinstance(op, attn.RopeOp):
                assert xp is not None and self.layout is not None
                r, half = self.layout.rotary_dim, self.layout.rotary_dim // 2
                interleaved = self.layout.style == "interleaved"
                pair = kb.floordiv(offs_d, 2) if interleaved else kb.rem(offs_d, half)
                first = kb.cmp("==", kb.rem(offs_d, 2), 0) if interleaved else kb.cmp("<", offs_d, half)
                sign = kb.where(first, -1.0, 1.0, hint=f"{prefix}_sign")
                rotated = kb.cmp("<", offs_d, r)
                if op.inv_freq is None:
                    cos_ptr, sin_ptr = self.rope_tables(p, op)
                    tok_sign = None
                    if prefix == "q":  # query positions Nk - Nq + i are negative when Nq > Nk
                        tok_sign = tok_axis(kb.where(kb.cmp("<", pos, 0), -1.0, 1.0))
                        pos = kb.unary(tl.AbsOp, pos)
                    idx = kb.add(kb.mul(tok_axis(pos), half), chan_axis(pair), hint=f"{prefix}_trig_idx")
                    tmask = chan_axis(rotated)
                    if tok_ok is not None:
                        tmask = kb.and_(tok_axis(tok_ok), tmask)
                    cos = kb.load(kb.add(cos_ptr, idx), tmask, 1.0, hint=f"{prefix}_cos")
                    sin = kb.mul(kb.load(kb.add(sin_ptr, idx), tmask, 0.0), chan_axis(sign), hint=f"{prefix}_sin")
                    if tok_sign is not None:
                        sin = kb.mul(sin, tok_sign, hint=f"{prefix}_sin")
                else:
                    freq_ptr = self.tensor(p, op.inv_freq)
                    freq = kb.cast(
                        kb.load(
                            kb.add(freq_ptr.ptr, kb.mul(pair, freq_ptr.strides[0])),
                            rotated,
                            0.0,
                            hint=f"{prefix}_inv_freq",
                        ),
                        f32,
                    )
                    angle = kb.mul(tok_axis(kb.cast(pos, f32)), chan_axis(freq), hint=f"{prefix}_angle")
                    cos = kb.unary(tl.CosOp, angle, hint=f"{prefix}_cos")
                    sin = kb.mul(kb.unary(tl.SinOp, angle), chan_axis(sign), hint=f"{prefix}_sin")
                x = kb.add(kb.mul(x, cos), kb.mul(xp, sin), hint=f"{prefix}_rot")
                xp = None
            else:
                raise DiagnosticException(f"'{op.name}' cannot transform q or k")
        return x

    # ------------------------------------------------------------------ score ops
    def region_value(
        self,
        kb: KernelBuilder,
        p: Params,
        op: attn.MaskOp | attn.BiasOp | attn.ScoreModOp,
        ctx: dict[str, SSAValue],
        score: SSAValue | None,
    ) -> SSAValue:
        """Lower a custom region to tile expressions and return its yielded value."""
        block = op.body.blocks[0]
        args = list(block.args)
        env: dict[SSAValue, SSAValue] = {}
        if score is not None:
            env[args.pop(0)] = score
        env[args[0]], env[args[1]] = ctx["b"], ctx["h"]
        env[args[2]], env[args[3]] = ctx["q_idx"], ctx["kv_idx"]
        extras = {a: self.tensor(p, e) for a, e in zip(args[4:], op.extras, strict=True)}
        cmp_i = {0: "==", 1: "!=", 2: "<", 3: "<=", 4: ">", 5: ">=", 6: "<", 7: "<=", 8: ">", 9: ">="}
        cmp_f = {
            1: "==",
            2: ">",
            3: ">=",
            4: "<",
            5: "<=",
            6: "!=",
            8: "==",
            9: ">",
            10: ">=",
            11: "<",
            12: "<=",
            13: "!=",
        }
        simple: dict[type, Callable[[SSAValue, SSAValue], SSAValue]] = {
            arith.AddiOp: kb.add,
            arith.AddfOp: kb.add,
            arith.SubiOp: kb.sub,
            arith.SubfOp: kb.sub,
            arith.MuliOp: kb.mul,
            arith.MulfOp: kb.mul,
            arith.DivfOp: kb.div,
            arith.DivSIOp: kb.floordiv,
            arith.RemSIOp: kb.rem,
            arith.AndIOp: kb.and_,
            arith.OrIOp: kb.or_,
            arith.XOrIOp: lambda a, b: kb.binary(tl.XorOp, a, b),
            arith.MaxSIOp: kb.maximum,
            arith.MinSIOp: kb.minimum,
            arith.MaximumfOp: kb.maximum,
            arith.MinimumfOp: kb.minimum,
            arith.MaxnumfOp: kb.maximum,
            arith.MinnumfOp: kb.minimum,
        }
        unary: dict[type, type[tl.UnaryOp]] = {
            math.ExpOp: tl.ExpOp,
            math.LogOp: tl.LogOp,
            math.Exp2Op: tl.Exp2Op,
            math.Log2Op: tl.Log2Op,
            math.SqrtOp: tl.SqrtOp,
            math.RsqrtOp: tl.RsqrtOp,
            math.AbsFOp: tl.AbsOp,
            math.AbsIOp: tl.AbsOp,
            math.SinOp: tl.SinOp,
            math.CosOp: tl.CosOp,
            arith.NegfOp: tl.NegOp,
        }
        for inner in block.ops:
            o = [env.get(x) for x in inner.operands]
            res: SSAValue
            if isinstance(inner, attn.YieldOp):
                return env[inner.values[0]]
            if isinstance(inner, arith.ConstantOp):
                val = inner.value
                if isinstance(val, IntegerAttr):
                    res = kb.v(bool(val.value.data) if val.type == i1 else int(val.value.data))
                elif isinstance(val, FloatAttr):
                    res = kb.v(float(val.value.data))
                else:
                    raise DiagnosticException(f"unsupported constant {val} in {op.name} region")
            elif type(inner) in simple:
                res = simple[type(inner)](o[0], o[1])
            elif type(inner) in unary:
                res = kb.unary(unary[type(inner)], o[0])
            elif isinstance(inner, arith.FloorDivSIOp):
                q = kb.floordiv(o[0], o[1])
                r = kb.rem(o[0], o[1])
                adjust = kb.and_(kb.cmp("!=", r, 0), kb.cmp("!=", kb.cmp("<", o[0], 0), kb.cmp("<", o[1], 0)))
                res = kb.sub(q, kb.cast(adjust, i32))
            elif isinstance(inner, arith.CmpiOp):
                pred = inner.predicate.value.data
                a, b = o[0], o[1]
                if pred >= 6 and tl.scalar_of(a.type) != i1:
                    # Unsigned order is signed order with the sign bit flipped (kernel ints are i32).
                    a, b = (kb.binary(tl.XorOp, x, -(1 << 31)) for x in (a, b))
                res = kb.cmp(cmp_i[pred], a, b)
            elif isinstance(inner, arith.CmpfOp):
                pred = inner.predicate.value.data
                if pred not in cmp_f:
                    raise DiagnosticException(f"unsupported arith.cmpf predicate {pred} in {op.name}")
                res = kb.cmp(cmp_f[pred], o[0], o[1])
            elif isinstance(inner, arith.SelectOp):
                res = kb.where(o[0], o[1], o[2])
            elif isinstance(inner, arith.SIToFPOp | arith.ExtSIOp) and tl.scalar_of(o[0].type) == i1:
                # A signed i1 true is -1 (MLIR); Triton converts True to 1.
                res = kb.sub(0, kb.cast(o[0], f32 if isinstance(inner, arith.SIToFPOp) else i32))
            elif isinstance(inner, arith.SIToFPOp | arith.UIToFPOp | arith.ExtFOp | arith.TruncFOp):
                res = kb.cast(o[0], f32)
            elif isinstance(inner, arith.ExtUIOp):  # booleans in arithmetic: True -> 1
                res = kb.cast(o[0], i32)
            elif isinstance(inner, arith.FPToSIOp | arith.ExtSIOp | arith.TruncIOp | arith.IndexCastOp):
                res = kb.cast(o[0], i32) if tl.scalar_of(o[0].type) != i1 else o[0]
            elif isinstance(inner, math.TanhOp):
                two_x = kb.mul(o[0], 2.0)
                res = kb.sub(kb.mul(kb.unary(tl.SigmoidOp, two_x), 2.0), 1.0)
            elif isinstance(inner, math.PowFOp):
                res = kb.unary(tl.Exp2Op, kb.mul(o[1], kb.unary(tl.Log2Op, o[0])))
            elif isinstance(inner, attn.ExtractOp):
                t = extras[inner.tensor]
                ptr = t.ptr
                tile_index = False
                for idx, stride in zip(o[1:], t.strides, strict=True):
                    ptr = kb.add(ptr, kb.mul(idx, stride))
                    tile_index |= tl.is_tile(idx.type)
                res = kb.load(ptr, ctx["valid"] if tile_index else None, 0)
            else:
                raise DiagnosticException(f"'{inner.name}' in an {op.name} region has no Triton lowering")
            env[inner.results[0]] = res
        raise DiagnosticException(f"{op.name} region has no attn.yield")

    def score_ops(self, kb: KernelBuilder, p: Params, s: SSAValue, ctx: dict[str, SSAValue], masked: bool) -> SSAValue:
        """Apply the score chain to `s`; masks only where `masked` (partial blocks).

        Masks are applied after the last score op, whatever their place in the chain: a
        masked score stays masked (a softcap or score_mod after the mask must not turn
        its -inf into a finite value)."""
        keep: SSAValue | None = None
        for op in self.v.score_ops:
            if isinstance(op, attn.ScaleOp):
                s = kb.mul(s, op.value.value.data)
            elif isinstance(op, attn.SoftcapOp):
                cap = op.cap.value.data
                t = kb.unary(tl.SigmoidOp, kb.mul(s, 2.0 / cap))
                s = kb.mul(kb.sub(kb.mul(t, 2.0), 1.0), cap, hint="s_capped")
            elif isinstance(op, attn.BiasOp):
                if op.kind.data == "alibi":
                    slopes = self.tensor(p, op.extras[0])
                    slope = kb.cast(kb.load(kb.add(slopes.ptr, kb.mul(ctx["h"], slopes.strides[0])), hint="slope"), f32)
                    rel = kb.cast(kb.sub(ctx["kv_idx"], ctx["q_idx"]), f32)
                    s = kb.add(s, kb.mul(rel, slope), hint="s_biased")
                else:
                    s = kb.add(s, self.region_value(kb, p, op, ctx, None), hint="s_biased")
            elif isinstance(op, attn.ScoreModOp):
                s = self.region_value(kb, p, op, ctx, s)
            elif isinstance(op, attn.MaskOp):
                if masked:
                    pred = self.predicate(kb, p, op, ctx)
                    keep = pred if keep is None else kb.and_(keep, pred, hint="keep")
            else:
                raise DiagnosticException(f"'{op.name}' cannot modify scores")
        if keep is not None:
            s = kb.where(keep, s, NEG_INF, hint="s_masked")
        return s

    def predicate(self, kb: KernelBuilder, p: Params, op: attn.MaskOp, ctx: dict[str, SSAValue]):
        q, kv = ctx["q_idx"], ctx["kv_idx"]
        kind = op.kind.data
        param = op.param.value.data if op.param is not None else 0
        if kind == "causal":
            return kb.cmp("<=", kv, q, hint="causal")
        if kind == "sliding_window":
            d = kb.sub(q, kv)
            return kb.and_(kb.cmp(">=", d, 0), kb.cmp("<", d, param), hint="in_window")
        if kind == "prefix_lm":
            return kb.or_(kb.cmp("<", kv, param), kb.cmp("<=", kv, q), hint="prefix_or_causal")
        if kind == "document":
            ids = self.tensor(p, op.extras[0])
            base = kb.add(ids.ptr, kb.mul(ctx["b"], ids.strides[0]))
            doc_k = kb.load(kb.add(base, kb.mul(kv, ids.strides[1])), ctx["kv_ok_col"], -2, hint="doc_k")
            return kb.cmp("==", ctx[f"doc_q_{ids.ptr.name_hint}"], doc_k, hint="same_doc")
        return self.region_value(kb, p, op, ctx, None)

    # ------------------------------------------------------------------ KV segments
    def segments(self, kb: KernelBuilder, q_lo: SSAValue, q_hi: SSAValue, nk: SSAValue):
        """[(lo, hi, masked)] KV ranges for this Q block, in order."""
        bn = self.block_n
        vlo: SSAValue | int = 0
        vhi: SSAValue = nk
        flo: SSAValue | int = 0
        fhi: SSAValue = nk
        opaque = False
        for bound in self.kv_bounds:
            if bound.mask_kind is None:
                opaque = True
                continue
            name, n = bound.mask_kind.name, bound.param_value
            if name == "causal":
                v_hi, f_hi = kb.add(q_hi, 1), kb.add(q_lo, 1)
                v_lo = f_lo = 0
            elif name == "sliding_window":
                v_lo, v_hi = kb.sub(q_lo, n - 1), kb.add(q_hi, 1)
                f_lo, f_hi = kb.sub(q_hi, n - 1), kb.add(q_lo, 1)
            else:  # prefix_lm
                v_lo = f_lo = 0
                v_hi, f_hi = kb.maximum(kb.add(q_hi, 1), n), kb.maximum(kb.add(q_lo, 1), n)
            vlo = vlo if v_lo == 0 else kb.maximum(vlo, v_lo)
            flo = flo if f_lo == 0 else kb.maximum(flo, f_lo)
            vhi, fhi = kb.minimum(vhi, v_hi), kb.minimum(fhi, f_hi)
        lo = kb.mul(kb.floordiv(vlo, bn), bn, hint="kv_lo") if not isinstance(vlo, int) else kb.v(0)
        hi = vhi if vhi is nk else kb.maximum(vhi, 0, hint="kv_hi")
        if opaque:
            return [(lo, hi, True)]
        # Full blocks: [flo, fhi) rounded inwards to whole blocks, kept inside [lo, hi).
        if isinstance(flo, int):
            f_start = kb.minimum(lo, hi, hint="full_lo") if isinstance(vlo, SSAValue) else lo
        else:
            f_start = kb.minimum(kb.maximum(kb.mul(kb.cdiv(flo, bn), bn), lo), hi, hint="full_lo")
        f_end = kb.mul(kb.floordiv(kb.maximum(fhi, 0), bn), bn)
        f_end = kb.maximum(kb.minimum(f_end, hi), f_start, hint="full_hi")
        return [(lo, f_start, True), (f_start, f_end, False), (f_end, hi, True)]

    # ------------------------------------------------------------------ kernels
    def main_kernel(self) -> tuple[tl.KernelOp, Params]:
        p = Params()
        kb = KernelBuilder(p, p.block)
        v = self.v
        bm, bn = self.block_m, self.block_n
        q = self.tensor(p, v.q_arg)
        pre = self.k_placement == Placement.PREROTATE
        k = self.tensor(p, v.k_arg, key="k_rot" if pre else None, host="k_rot" if pre else None)
        vt = self.tensor(p, v.v_arg)
        out_ptr = p.get("Out", tl.PointerType(self.dtype), "out")
        out_strides = [p.get(f"stride_o_{d}", i32, f"out.stride({d})") for d in range(4)]
        lse_ptr = p.get("Lse", tl.PointerType(f32), "lse")
        q_name = self.names[self.arg_index(v.q_arg)]
        k_name = self.names[self.arg_index(v.k_arg)]
        nq = p.get("NQ", i32, f"{q_name}.shape[2]")
        nk = p.get("NK", i32, f"{k_name}.shape[2]")
        block_m = p.get("BLOCK_M", i32, str(bm), constexpr=True)
        block_n = p.get("BLOCK_N", i32, str(bn), constexpr=True)

        # Grid (batch x heads, Q blocks), Q blocks walked from the last: with a causal mask the
        # last Q blocks do the most work, and starting them first shortens the tail of the
        # launch (11-12% at N=4096 on the H200, benchmarks/NOTES.md).
        pid_bh = kb._add(tl.ProgramIdOp(0), "pid_bh")
        num_q_blocks = kb._add(tl.NumProgramsOp(1), "num_q_blocks")
        pid_m = kb.sub(kb.sub(num_q_blocks, 1), kb._add(tl.ProgramIdOp(1), "q_block"), hint="pid_m")
        b = kb.floordiv(pid_bh, self.hq, hint="b")
        h = kb.rem(pid_bh, self.hq, hint="h")
        hk = kb.floordiv(h, self.hq // self.hkv, hint="h_kv") if self.hq != self.hkv else h
        offs_m = kb.add(kb.mul(pid_m, block_m), kb.arange(block_m), hint="offs_m")
        row_ok = kb.cmp("<", offs_m, nq, hint="row_ok")
        shift = kb.sub(nk, nq, hint="q_shift")
        q_pos = kb.add(offs_m, shift, hint="q_pos")

        # Q prologue: load, transform, fold the scale (and log2 e), cast once.
        q_base = kb.add(kb.add(q.ptr, kb.mul(b, q.strides[0])), kb.mul(h, q.strides[1]), hint="q_base")
        q_x = self.transformed(
            kb,
            p,
            v.q_chain,
            lambda chans: self.load_tile(kb, q_base, offs_m, row_ok, q.strides[2], q.strides[3], chans, True, "q"),
            q_pos,
            row_ok,
            True,
            "q",
        )
        q_tile = kb.cast(kb.mul(q_x, self.q_prescale), self.dtype, hint="q_tile")

        k_base = kb.add(kb.add(k.ptr, kb.mul(b, k.strides[0])), kb.mul(hk, k.strides[1]), hint="k_base")
        v_base = kb.add(kb.add(vt.ptr, kb.mul(b, vt.strides[0])), kb.mul(hk, vt.strides[1]), hint="v_base")
        offs_d = kb.arange(self.dpad, hint="offs_d")
        bdv = _pow2(self.dv)
        offs_dv = kb.arange(bdv, hint="offs_dv")
        dv_ok = kb.cmp("<", offs_dv, self.dv, hint="dv_ok") if bdv != self.dv else None

        ctx: dict[str, SSAValue] = {"b": b, "h": h, "q_idx": kb.row(q_pos)}
        for mask in v.masks:  # the query's id of each document mask, loaded once
            if mask.kind.data == "document":
                ids = self.tensor(p, mask.extras[0])
                ids_ptr = kb.add(kb.add(ids.ptr, kb.mul(b, ids.strides[0])), kb.mul(q_pos, ids.strides[1]))
                ctx[f"doc_q_{ids.ptr.name_hint}"] = kb.row(kb.load(ids_ptr, row_ok, -1, hint="doc_q"))

        m_i = kb.full([block_m], NEG_INF, f32, hint="m_i")
        l_i = kb.full([block_m], 0.0, f32, hint="l_i")
        acc = kb.full([block_m, bdv], 0.0, f32, hint="acc")
        carried = {"m_i": m_i, "l_i": l_i, "acc": acc}

        q_lo = kb.add(kb.mul(pid_m, block_m), shift, hint="q_lo")
        q_hi = kb.minimum(kb.add(q_lo, bm - 1), kb.sub(nk, 1), hint="q_hi")
        segments = self.segments(kb, q_lo, q_hi, nk)

        def body(masked: bool):
            def build(ib: KernelBuilder, start_n: SSAValue, c: dict[str, SSAValue]) -> dict[str, SSAValue]:
                offs_n = ib.add(start_n, ib.arange(block_n), hint="offs_n")
                kv_ok = ib.cmp("<", offs_n, nk, hint="kv_ok") if masked else None

                def load_k(chans: SSAValue) -> SSAValue:
                    return self.load_tile(ib, k_base, offs_n, kv_ok, k.strides[2], k.strides[3], chans, False, "k")

                if self.k_placement == Placement.KV_LOOP:
                    k_x = self.transformed(ib, p, v.k_chain, load_k, offs_n, kv_ok, False, "k")
                    k_tile = ib.cast(k_x, self.kdtype, hint="k_tile")
                else:
                    k_tile = load_k(offs_d)
                s = ib.dot(q_tile, k_tile, None, self.precision, hint="s")
                lctx = dict(ctx)
                lctx["kv_idx"] = ib.col(offs_n)
                if masked:
                    lctx["kv_ok_col"] = ib.col(kv_ok)
                    lctx["valid"] = ib.and_(ib.row(row_ok), lctx["kv_ok_col"])
                else:
                    lctx["kv_ok_col"] = lctx["valid"] = ib.row(row_ok)
                s = self.score_ops(ib, p, s, lctx, masked)
                if not self.log2e_folded:
                    s = ib.mul(s, LOG2E, hint="s2")
                if masked:
                    s = ib.where(lctx["kv_ok_col"], s, NEG_INF, hint="s_valid")
                m_new = ib.maximum(c["m_i"], ib.reduce("max", s, 1), hint="m_new")
                m_safe = ib.where(ib.cmp("==", m_new, NEG_INF), 0.0, m_new, hint="m_safe")
                pr = ib.unary(tl.Exp2Op, ib.sub(s, ib.row(m_safe)), hint="p")
                alpha = ib.unary(tl.Exp2Op, ib.sub(c["m_i"], m_safe), hint="alpha")
                l_new = ib.add(ib.mul(c["l_i"], alpha), ib.reduce("sum", pr, 1), hint="l_new")
                acc_s = ib.mul(c["acc"], ib.row(alpha), hint="acc_scaled")
                v_ptr = ib.add(
                    ib.add(v_base, ib.mul(ib.row(offs_n), vt.strides[2])),
                    ib.mul(ib.col(offs_dv), vt.strides[3]),
                    hint="v_ptr",
                )
                vmask = ib.row(kv_ok) if kv_ok is not None else None
                if dv_ok is not None:
                    vmask = ib.col(dv_ok) if vmask is None else ib.and_(vmask, ib.col(dv_ok))
                vv = ib.load(v_ptr, vmask, 0.0, hint="v")
                acc_n = ib.dot(ib.cast(pr, self.vdtype), vv, acc_s, self.precision, hint="acc_new")
                return {"m_i": m_new, "l_i": l_new, "acc": acc_n}

            return build

        for lo, hi, masked in segments:
            if lo is not hi:  # a segment from a bound to itself is statically empty
                carried = kb.loop(lo, hi, block_n, carried, body(masked))

        m_i, l_i, acc = carried["m_i"], carried["l_i"], carried["acc"]
        if v.softmax.sink is not None:
            sink = self.tensor(p, v.softmax.sink)
            sk = kb.mul(
                kb.cast(kb.load(kb.add(sink.ptr, kb.mul(h, sink.strides[0])), hint="sink"), f32), LOG2E, hint="sink2"
            )
            m_new = kb.maximum(m_i, sk, hint="m_sink")
            alpha = kb.unary(tl.Exp2Op, kb.sub(m_i, m_new))
            l_i = kb.add(kb.mul(l_i, alpha), kb.unary(tl.Exp2Op, kb.sub(sk, m_new)), hint="l_sink")
            acc = kb.mul(acc, kb.row(alpha))
            m_i = m_new
        empty = kb.cmp("==", l_i, 0.0, hint="empty_row")
        l_safe = kb.where(empty, 1.0, l_i, hint="l_safe")
        out = kb.cast(kb.div(acc, kb.row(l_safe)), self.dtype, hint="out")
        o_ptr = kb.add(
            kb.add(kb.add(out_ptr, kb.mul(b, out_strides[0])), kb.mul(h, out_strides[1])),
            kb.add(kb.mul(kb.row(offs_m), out_strides[2]), kb.mul(kb.col(offs_dv), out_strides[3])),
            hint="o_ptr",
        )
        omask = kb.row(row_ok)
        if dv_ok is not None:
            omask = kb.and_(omask, kb.col(dv_ok))
        kb.store(o_ptr, out, omask)
        # log2 of l_safe, not l: an empty row's lse is -inf without evaluating log2(0).
        lse = kb.mul(kb.add(m_i, kb.unary(tl.Log2Op, l_safe)), LN2)
        lse = kb.where(empty, NEG_INF, lse, hint="lse")
        kb.store(kb.add(lse_ptr, kb.add(kb.mul(pid_bh, nq), offs_m)), lse, row_ok)
        p.block.add_op(tl.ReturnOp())
        return self.kernel("attn_fwd", p), p

    def rotate_kernel(self) -> tuple[tl.KernelOp, Params]:
        """Apply K's transforms once, writing a rotated copy of K."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        v = self.v
        k = self.tensor(p, v.k_arg)
        k_rot_ptr = p.get("K_rot", tl.PointerType(self.kdtype), "k_rot")
        k_rot_strides = [p.get(f"stride_kr_{d}", i32, f"k_rot.stride({d})") for d in range(4)]
        nk = p.get("NK", i32, f"{self.names[self.arg_index(v.k_arg)]}.shape[2]")
        block_n = p.get("BLOCK_N", i32, "64", constexpr=True)
        pid_n = kb._add(tl.ProgramIdOp(0), "pid_n")
        pid_bh = kb._add(tl.ProgramIdOp(1), "pid_bh")
        b = kb.floordiv(pid_bh, self.hkv, hint="b")
        hk = kb.rem(pid_bh, self.hkv, hint="h_kv")
        offs_n = kb.add(kb.mul(pid_n, block_n), kb.arange(block_n), hint="offs_n")
        ok = kb.cmp("<", offs_n, nk, hint="kv_ok")
        base = kb.add(kb.add(k.ptr, kb.mul(b, k.strides[0])), kb.mul(hk, k.strides[1]), hint="k_base")
        k_x = self.transformed(
            kb,
            p,
            v.k_chain,
            lambda chans: self.load_tile(kb, base, offs_n, ok, k.strides[2], k.strides[3], chans, True, "k"),
            offs_n,
            ok,
            True,
            "k",
        )
        offs_d = kb.arange(self.dpad, hint="offs_d")
        out_base = kb.add(kb.add(k_rot_ptr, kb.mul(b, k_rot_strides[0])), kb.mul(hk, k_rot_strides[1]))
        ptr = kb.add(
            kb.add(out_base, kb.mul(kb.row(offs_n), k_rot_strides[2])),
            kb.mul(kb.col(offs_d), k_rot_strides[3]),
            hint="k_rot_ptr",
        )
        mask = kb.row(ok)
        if self.dpad != self.d:
            mask = kb.and_(mask, kb.col(kb.cmp("<", offs_d, self.d)))
        kb.store(ptr, kb.cast(k_x, self.kdtype), mask)
        p.block.add_op(tl.ReturnOp())
        return self.kernel("rotate_k", p), p

    def kernel(self, name: str, p: Params) -> tl.KernelOp:
        arg_types = [a.type for a in p.block.args]
        kernel = tl.KernelOp(
            name, arg_types, [a.name_hint or f"a{i}" for i, a in enumerate(p.block.args)], p.constexprs
        )
        # Move the built body into the kernel (keeping the arguments we created).
        old = kernel.body.block
        kernel.body.detach_block(old)
        kernel.body.add_block(p.block)
        _erase_dead(p.block)
        return kernel

    def launcher(self, calls: list[tuple[tl.KernelOp, Params, list[str]]]) -> tl.LauncherOp:
        v = self.v
        q, k = self.names[self.arg_index(v.q_arg)], self.names[self.arg_index(v.k_arg)]
        ops: list[Operation] = [
            tl.AllocOp(
                "out",
                [f"{q}.shape[0]", str(self.hq), f"{q}.shape[2]", str(self.dv)],
                dtype_name(self.dtype, "torch"),
                f"{q}.device",
            ),
            tl.AllocOp("lse", [f"{q}.shape[0]", str(self.hq), f"{q}.shape[2]"], "torch.float32", f"{q}.device"),
        ]
        if self.k_placement == Placement.PREROTATE:
            ops.append(
                tl.AllocOp(
                    "k_rot",
                    [f"{k}.shape[0]", str(self.hkv), f"{k}.shape[2]", str(self.d)],
                    dtype_name(self.kdtype, "torch"),
                    f"{k}.device",
                )
            )
        for key, (values, magnitude) in self.tables.items():
            # Positions 0..Nk-1, and |Nk - Nq + i| < Nq for queries.
            length = f"max({q}.shape[2], {k}.shape[2])"
            ops.append(tl.RopeTableOp(f"{key}_cos", f"{key}_sin", values, length, magnitude, f"{q}.device"))
        for kernel, p, grid in calls:
            # The pre-rotation kernel is a streaming copy: 4 warps, no software pipelining.
            warps, stages = (4, 1) if kernel.sym_name.data == "rotate_k" else (self.num_warps, self.num_stages)
            ops.append(tl.CallOp(kernel.sym_name.data, grid, p.host, warps, stages))
        ops.append(tl.HostReturnOp(["out", "lse"]))
        return tl.LauncherOp("launch", self.names, ops)


def kv_bounds(v: AttentionChains) -> list[KvBoundAttr]:
    """causal-split's `attn.kv_blocks`; without it every mask is opaque."""
    kv_blocks = v.func.attributes.get("attn.kv_blocks")
    if kv_blocks is None:
        return [KvBoundAttr(KvBoundAttr.OPAQUE)] * len(v.masks)
    bounds = kv_blocks.data if isinstance(kv_blocks, ArrayAttr) else ()
    if not isinstance(kv_blocks, ArrayAttr) or not all(isinstance(b, KvBoundAttr) for b in bounds):
        raise DiagnosticException(
            f"func @{v.func.sym_name.data} attribute attn.kv_blocks must be a list of #attn.kv_bound<...>, "
            f"got {kv_blocks}"
        )
    return list(bounds)  # type: ignore[arg-type]


def _erase_dead(block: Block) -> None:
    """Drop values the lowering built but no op uses (e.g. masks only some variants need)."""
    for op in reversed(list(block.ops)):
        for region in op.regions:
            for inner in region.blocks:
                _erase_dead(inner)
        if op.results and not isinstance(op, tl.ForOp) and all(not r.uses for r in op.results):
            block.erase_op(op)


def arg_names(f: func.FuncOp) -> list[str]:
    """Python parameter names of the launcher: the function's argument names."""
    names: list[str] = []
    for i, a in enumerate(f.body.block.args):
        n = a.name_hint if a.name_hint and a.name_hint.isidentifier() else f"arg{i}"
        reserved = n in RESERVED_NAMES or n in ("out", "lse", "k_rot")
        if n in names or reserved or n.startswith(("inv_freq", "rope_", "_")):
            n = f"{n}_{i}"
        names.append(n)
    return names


@dataclass(frozen=True)
class ConvertAttnToTlPass(ModulePass):
    """Replace each attention function by its Triton kernel(s) (`tl.kernel`) and a host
    launcher (`tl.launcher @launch`) that allocates the outputs and launches them."""

    name = "convert-attn-to-tl"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        funcs = variant_funcs(op)
        if len(funcs) > 1:
            raise DiagnosticException(
                "convert-attn-to-tl lowers one attention function per module, found "
                f"{len(funcs)}: split the input (e.g. --split-input-file)"
            )
        for f in funcs:
            v = analyse(f)
            lowering = Lowering(v, arg_names(f))
            calls = []
            kernels = []
            if lowering.k_placement == Placement.PREROTATE:
                kr, pr = lowering.rotate_kernel()
                k = lowering.names[lowering.arg_index(v.k_arg)]
                calls.append((kr, pr, [f"triton.cdiv({k}.shape[2], 64)", f"{k}.shape[0] * {lowering.hkv}"]))
                kernels.append(kr)
            km, pm = lowering.main_kernel()
            q = lowering.names[lowering.arg_index(v.q_arg)]
            calls.append((km, pm, [f"{q}.shape[0] * {lowering.hq}", f"triton.cdiv({q}.shape[2], {lowering.block_m})"]))
            kernels.append(km)
            launcher = lowering.launcher(calls)
            block = f.parent_block()
            assert block is not None
            block.insert_ops_before([*kernels, launcher], f)
            f.detach()
            f.erase()
