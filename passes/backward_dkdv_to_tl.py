"""The backward's dK/dV kernel (`backward_to_tl`), `attn_bwd_dkdv`: one program per (KV block,
batch x kv head) walks the Q blocks of every query head of its group (GQA sums in registers, no
atomics: deterministic) over the blocks causal-split allows (`q_segments`), recomputes P^T
from the saved log-sum-exp, accumulates dV = P^T dO and dK = dS^T Q, and applies K's
derivatives before storing dK (`backward_epilogues_to_tl`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32, i64
from xdsl.ir import SSAValue

from attnfuse.dialects import tl
from attnfuse.dialects.attn import LOG2E
from attnfuse.passes.backward_epilogues_to_tl import store_gradient
from attnfuse.passes.kernel_lowering import NEG_INF, POS_INF, ScoreCtx
from attnfuse.passes.kv_segments import q_segments
from attnfuse.passes.launcher_to_tl import KernelCall
from attnfuse.passes.tl_builder import KernelBuilder, Params, pow2

if TYPE_CHECKING:
    from attnfuse.passes.backward_to_tl import BackwardLowering


def dkdv_kernel(bl: BackwardLowering) -> KernelCall:
    """`attn_bwd_dkdv`: dK and dV of one KV block, over the Q blocks of its query heads."""
    p = Params()
    kb = KernelBuilder(p, p.block)
    bkey, bq = bl.block_m, bl.block_n
    qs, ks, v, do, lse_ptr, delta_ptr, lengths, block_m, block_n = bl.loop_params(p)
    kv = bl.kv_program(kb, lengths, block_m)
    pid_n, pid_bh, b, hk, b_off, hk_off = kv.pid_n, kv.pid_bh, kv.b, kv.hk, kv.b_off, kv.hk_off
    n_start, n_off, rows_n, offs_n, kv_ok, nq, nk = kv.n_start, kv.n_off, kv.rows_n, kv.offs_n, kv.kv_ok, kv.nq, kv.nk
    k_base = bl.base(kb, ks, b_off, hk_off)
    k_t = bl.tile(kb, ks, k_base, n_off, rows_n, kv_ok, bl.d, "k")
    v_base = bl.base(kb, v, b_off, hk_off)
    v_t = bl.tile(kb, v, v_base, n_off, rows_n, kv_ok, bl.dv, "v")
    shift = kb.sub(nk, nq, hint="q_shift")
    k_hi = kb.minimum(kb.add(n_start, bkey - 1), kb.sub(nk, 1), hint="k_hi")
    segments = q_segments(kb, bl.kv_bounds, n_start, k_hi, shift, nq, bq)
    group = bl.hq // bl.hkv
    carried = {
        "dk": kb.full([block_m, bl.dpad], 0.0, f32, hint="dk"),
        "dv": kb.full([block_m, pow2(bl.dv)], 0.0, f32, hint="dv"),
    }
    kv_idx = kb.row(offs_n)

    def head(hb: KernelBuilder, hg: SSAValue | None, c: dict[str, SSAValue]) -> dict[str, SSAValue]:
        h = hk if hg is None else hb.add(hb.mul(hk, group), hg, hint="h")
        h_off = hb.cast(h, i64, hint="h_off")
        q_base = bl.base(hb, qs, b_off, h_off)
        do_base = bl.base(hb, do, b_off, h_off)
        row_base = kv.lse_rows(hb, h_off, bl.hq)
        for lo, hi, masked in segments:

            def step(ib: KernelBuilder, start_m: SSAValue, c: dict[str, SSAValue], masked=masked):
                rows = ib.arange(block_n, hint="rows_m")
                offs_m = ib.add(start_m, rows, hint="offs_m")
                row_ok = ib.cmp("<", offs_m, nq, hint="row_ok")
                m_off = kv.q_rows(ib, start_m)
                q_t = bl.tile(ib, qs, q_base, m_off, rows, row_ok, bl.d, "q")
                s = bl.scores(ib, ib.dot(k_t, ib.emit(tl.TransOp(q_t)), None, bl.precision, hint="kq"))
                q_pos = ib.add(offs_m, shift, hint="q_pos")
                docs = {a: ib.col(t) for a, t in bl.doc_ids(ib, p, b_off, q_pos, row_ok).items()}
                valid = ib.and_(ib.row(kv_ok), ib.col(row_ok))
                ctx = ScoreCtx(b, h, b_off, ib.col(q_pos), kv_idx, ib.row(kv_ok), valid, docs, bl.fast_tanh)
                env: dict[SSAValue, SSAValue] = {}
                s = bl.score_ops(ib, p, s, ctx, masked, env)
                lse = bl.row_stat(ib, lse_ptr, row_base, offs_m, row_ok, POS_INF, "lse")
                lse2 = ib.mul(ib.where(ib.cmp("==", lse, NEG_INF), POS_INF, lse), LOG2E, hint="lse2")
                pt, dropped = bl.probs(ib, s, ib.col(lse2), masked)
                do_t = bl.tile(ib, do, do_base, m_off, rows, row_ok, bl.dv, "do")
                new = dict(c)
                if bl.need_dv:
                    new["dv"] = ib.dot(ib.cast(pt, bl.dtype), do_t, c["dv"], bl.precision, hint="dv")
                if bl.need_dk:
                    dp = ib.dot(v_t, ib.emit(tl.TransOp(do_t)), None, bl.precision, hint="dp")
                    delta = bl.row_stat(ib, delta_ptr, row_base, offs_m, row_ok, 0.0, "delta")
                    ds = bl.score_grad(ib, p, pt, dp, ib.col(delta), env, ctx, dropped)
                    new["dk"] = ib.dot(ib.cast(ds, bl.dtype), q_t, c["dk"], bl.precision, hint="dk")
                return new

            c = hb.loop(lo, hi, block_n, c, step, iv_name="start_m")
        return c

    if group == 1:
        carried = head(kb, None, carried)
    else:
        carried = kb.loop(0, group, 1, carried, lambda hb, hg, c: head(hb, hg, c), iv_name="hg")
    if bl.need_dk:
        program = kb.add(kb.mul(pid_bh, kb.emit(tl.NumProgramsOp(0))), pid_n, hint="program")
        dk = kb.mul(carried["dk"], bl.scale)
        store_gradient(bl, kb, p, bl.k, dk, b_off, hk_off, n_off, rows_n, offs_n, offs_n, kv_ok, program, "dk")
    if bl.need_dv:
        dv_out = bl.typed_tensor(p, "DV", "dv", bl.vdtype)
        bl.store_tile(
            kb,
            dv_out,
            bl.base(kb, dv_out, b_off, hk_off),
            n_off,
            rows_n,
            kv_ok,
            bl.dv,
            kb.cast(carried["dv"], bl.vdtype),
        )
    p.block.add_op(tl.ReturnOp())
    return KernelCall(bl.kernel("attn_bwd_dkdv", p), p, bl.dkdv_grid(), bl.num_warps, bl.num_stages)
