"""The backward's epilogues (`backward_to_tl`): Q's and K's chains' derivatives, applied to the
dQ and dK tiles before they are stored (the inverse rotation of a RoPE, the RMSNorm backward,
a learned norm weight's per-program gradient share)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32, i64
from xdsl.ir import SSAValue

from attnfuse.dialects import attn, tl
from attnfuse.passes.qk_transforms_to_tl import RopeLayout
from attnfuse.passes.tl_builder import KernelBuilder, Params

if TYPE_CHECKING:
    from attnfuse.passes.backward_to_tl import BackwardLowering, Side


def chain_grad(
    bl: BackwardLowering,
    kb: KernelBuilder,
    p: Params,
    side: Side,
    g: SSAValue,
    load: Callable[[SSAValue], SSAValue],
    pos: SSAValue,
    ok: SSAValue,
    rows: SSAValue,
    program: SSAValue,
    prefix: str,
    g_at: Callable[[SSAValue], SSAValue] | None = None,
) -> SSAValue:
    """Apply `side`'s derivative ops to the gradient tile `g` [rows, head dim] (fp32);
    `load(channels)` reads the untransformed tile, `program` indexes weight partials. `g_at`,
    when `g` is a tile read from memory: `g_at(channels)` reads it again at other channels (a
    RoPE's derivative then takes the pair partners by that second load, not by a gather)."""
    normed: dict[SSAValue, tuple[SSAValue, SSAValue]] = {}
    """x and its rsqrt(mean(x^2) + eps) per norm input: a norm's weight gradient and its
    input gradient read the same ones."""
    factor = 1.0  # g = g_at(its channels) * factor while g_at is not None
    for op in side.grads:
        if isinstance(op, attn.ScaleOp):
            g = kb.mul(g, op.value.value.data)
            factor *= op.value.value.data
        elif isinstance(op, attn.RopeGradOp):
            g = rope_grad(bl, kb, p, op, g, pos, ok, rows, prefix, g_at, factor)
            g_at = None
        else:
            if op.operands[1] not in normed:
                x = forward_value(bl, kb, p, side, op.operands[1], load, pos, ok, prefix)
                total = kb.reduce("sum", kb.mul(x, x), 1)
                eps = op.eps.value.data
                normed[op.operands[1]] = (
                    x,
                    kb.unary(tl.RsqrtOp, kb.add(kb.div(total, float(bl.d)), eps), hint=f"{prefix}_rstd"),
                )
            x, r = normed[op.operands[1]]
            if isinstance(op, attn.NormWeightGradOp):
                part = kb.reduce("sum", kb.mul(kb.mul(g, x), kb.row(r)), 0, hint=f"{prefix}_dw")
                store_partial(bl, kb, p, op.dweight, part, program)
                continue
            gw = g
            if op.weight is not None:
                w = bl.tensor(p, op.weight)
                offs = kb.arange(bl.dpad)
                dmask = kb.cmp("<", offs, bl.d) if bl.dpad != bl.d else None
                gw = kb.mul(g, kb.col(kb.cast(kb.load(kb.add(w.ptr, kb.mul(offs, w.strides[0])), dmask, 0.0), f32)))
            proj = kb.div(kb.mul(kb.reduce("sum", kb.mul(gw, x), 1), kb.mul(r, r)), float(bl.d))
            g = kb.mul(kb.row(r), kb.sub(gw, kb.mul(x, kb.row(proj))), hint=f"{prefix}_dnorm")
            g_at = None
    return g


def store_gradient(
    bl: BackwardLowering,
    kb: KernelBuilder,
    p: Params,
    side: Side,
    g: SSAValue,
    b_off: SSAValue,
    h_off: SSAValue,
    row_off: SSAValue,
    rows: SSAValue,
    pos: SSAValue,
    offs: SSAValue,
    ok: SSAValue,
    program: SSAValue,
    name: str,
    g_at: Callable[[SSAValue], SSAValue] | None = None,
) -> None:
    """Store the fp32 gradient tile `g` of `side`'s rows `row_off + rows` (positions `pos`,
    row indices `offs`, in range where `ok`) of head `h_off` of batch `b_off` into the launcher's
    buffer `name` (dq or dk) in the side's dtype, after the side's chain's derivatives
    (`chain_grad`, which reads the untransformed tile and writes weight shares by `program`;
    `g_at`: g read again at other channels, when it is a tile read from memory)."""
    orig = bl.tensor(p, side.arg)
    orig_base = kb.add(bl.base(kb, orig, b_off, h_off), kb.mul(row_off, orig.strides[2]))
    hint = f"{name[1]}0"

    def load(chans: SSAValue) -> SSAValue:
        return bl.qk.load_tile(kb, orig_base, rows, ok, orig.strides[2], orig.strides[3], chans, True, hint)

    rope_pos = bl.positions(kb, p, side.chain, pos, b_off, offs, ok)
    g = chain_grad(bl, kb, p, side, g, load, rope_pos, ok, rows, program, name, g_at)
    out = bl.typed_tensor(p, name.upper(), name, side.dtype)
    bl.store_tile(kb, out, bl.base(kb, out, b_off, h_off), row_off, rows, ok, bl.d, kb.cast(g, side.dtype))


def forward_value(
    bl: BackwardLowering,
    kb: KernelBuilder,
    p: Params,
    side: Side,
    value: SSAValue,
    load: Callable[[SSAValue], SSAValue],
    pos: SSAValue,
    ok: SSAValue,
    prefix: str,
) -> SSAValue:
    """The tile of `value`, an intermediate of `side`'s forward chain, recomputed."""
    upto = 0 if value is side.arg else next(i + 1 for i, op in enumerate(side.chain) if op.results[0] is value)
    return bl.qk.transformed(kb, p, side.chain[:upto], load, pos, ok, True, f"{prefix}_x", side.signed_pos)


def rope_grad(
    bl: BackwardLowering,
    kb: KernelBuilder,
    p: Params,
    op: attn.RopeGradOp,
    g: SSAValue,
    pos: SSAValue,
    ok: SSAValue,
    rows: SSAValue,
    prefix: str,
    g_at: Callable[[SSAValue], SSAValue] | None = None,
    factor: float = 1.0,
) -> SSAValue:
    """g rotated back: g * cos - partner(g) * sign * sin, i.e. the rotation at -pos. The
    partners by `g_at(channels) * factor` (g read again from memory, g = g_at(its channels) *
    factor) if given, else gathered from g."""
    layout = RopeLayout(op.style_name, op.rotary_dim.value.data)
    offs_d, partner = bl.qk.channels(kb, layout)
    assert partner is not None
    if g_at is not None:
        gp = g_at(partner) if factor == 1.0 else kb.mul(g_at(partner), factor)
    else:
        index = kb.add(kb.mul(kb.row(rows), 0), kb.col(partner), hint=f"{prefix}_partner")
        gp = kb.emit(tl.GatherOp(g, index, 1), f"{prefix}_gp")
    return bl.qk.rotated(kb, p, op, layout, g, gp, offs_d, pos, ok, True, f"{prefix}_back", True, inverse=True)


def store_partial(
    bl: BackwardLowering, kb: KernelBuilder, p: Params, dweight: SSAValue, part: SSAValue, program: SSAValue
) -> None:
    """Write one program's share of a learned weight's gradient: a row of a float32
    [programs, head dim] buffer that the launcher sums."""
    index = bl.plan.wrt[bl.plan.returned.index(dweight)]
    name = f"grad_{index}"
    ptr = p.param(f"{name}_part", tl.PointerType(f32), f"{name}_part")
    offs = kb.arange(bl.dpad)
    dmask = kb.cmp("<", offs, bl.d) if bl.dpad != bl.d else None
    kb.store(kb.add(kb.add(ptr, kb.mul(kb.cast(program, i64), bl.dpad)), offs), part, dmask)
    if f"{name}_part" not in bl.partials:
        bl.partials.append(f"{name}_part")
