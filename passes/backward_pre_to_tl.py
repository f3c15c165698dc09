"""The backward's preprocess kernel (`backward_to_tl`), `attn_bwd_pre`: delta = rowsum(dout * out)
per query row and, for a learned sink, each program's share of the sink's gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32, i32, i64

from attnfuse.dialects import tl
from attnfuse.passes.launcher_to_tl import KernelCall
from attnfuse.passes.tl_builder import KernelBuilder, Params

if TYPE_CHECKING:
    from attnfuse.passes.backward_to_tl import BackwardLowering


@dataclass(frozen=True)
class PreConfig:
    """Launch shape of `attn_bwd_pre`: `block` query rows per program (also the sink gradient's
    shares per row of programs), `num_warps` warps."""

    block: int = 64
    num_warps: int = 4


PRE = PreConfig()


def pre_kernel(bl: BackwardLowering) -> KernelCall:
    """`attn_bwd_pre`: delta = rowsum(dout * out); with a sink, each program's share of
    -sum(exp(sink - lse) * delta)."""
    p = Params()
    kb = KernelBuilder(p, p.block)
    out_name, lse_name, dout_name = bl.host_of(3), bl.host_of(2), bl.host_of(1)
    o = bl.typed_tensor(p, "out", out_name, bl.dtype)
    do = bl.typed_tensor(p, "dout", dout_name, bl.dtype)
    delta_ptr = p.param("Delta", tl.PointerType(f32), "delta")
    nq = p.param("NQ", i32, f"{out_name}.shape[2]")
    block = p.param("BLOCK", i32, str(PRE.block), constexpr=True)
    pid_m = kb.emit(tl.ProgramIdOp(0), "pid_m")
    pid_bh = kb.emit(tl.ProgramIdOp(1), "pid_bh")
    b_off = kb.cast(kb.floordiv(pid_bh, bl.hq), i64, hint="b_off")
    h_off = kb.cast(kb.rem(pid_bh, bl.hq), i64, hint="h_off")
    m_start = kb.mul(pid_m, block, hint="m_start")
    m_off = kb.cast(m_start, i64)
    rows = kb.arange(block, hint="rows")
    ok = kb.cmp("<", kb.add(m_start, rows), nq, hint="row_ok")
    o_t = kb.cast(bl.tile(kb, o, bl.base(kb, o, b_off, h_off), m_off, rows, ok, bl.dv, "o"), f32)
    do_t = kb.cast(bl.tile(kb, do, bl.base(kb, do, b_off, h_off), m_off, rows, ok, bl.dv, "do"), f32)
    delta = kb.reduce("sum", kb.mul(o_t, do_t), 1, hint="delta")
    row_base = kb.add(kb.mul(kb.cast(pid_bh, i64), nq), m_off, hint="row_base")
    kb.store(kb.add(kb.add(delta_ptr, row_base), rows), delta, ok)
    sink_grad = bl.plan.sink_grad
    if sink_grad is not None and bl.plan.needs(sink_grad.dsink):
        lse_ptr = p.param("Lse", tl.PointerType(f32), lse_name)
        sink = bl.tensor(p, sink_grad.sink)
        sk = kb.cast(kb.load(kb.add(sink.ptr, kb.mul(h_off, sink.strides[0])), hint="sink"), f32)
        lse = kb.load(kb.add(kb.add(lse_ptr, row_base), rows), ok, 0.0, hint="lse")
        share = kb.where(ok, kb.mul(kb.unary(tl.ExpOp, kb.sub(sk, lse)), delta), 0.0)
        part_ptr = p.param("DSink_part", tl.PointerType(f32), "dsink_part")
        programs = kb.add(kb.mul(kb.cast(pid_bh, i64), kb.emit(tl.NumProgramsOp(0))), kb.cast(pid_m, i64))
        kb.store(kb.add(part_ptr, programs), kb.sub(0.0, kb.reduce("sum", share, 0)))
    p.block.add_op(tl.ReturnOp())
    grid = [f"_cdiv({out_name}.shape[2], {PRE.block})", f"{out_name}.shape[0] * {bl.hq}"]
    return KernelCall(bl.kernel("attn_bwd_pre", p), p, grid, PRE.num_warps, 1)
