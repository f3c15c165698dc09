"""The backward's dQ kernel (`backward_to_tl`), `attn_bwd_dq`: one program per (Q block,
batch x head) walks the KV blocks it attends to (`kv_segments`), accumulates dQ = dS K and
applies Q's derivatives before storing dQ (`backward_epilogues_to_tl`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32, i64
from xdsl.ir import SSAValue

from attnfuse.dialects import tl
from attnfuse.dialects.attn import LOG2E
from attnfuse.passes.backward_epilogues_to_tl import store_gradient
from attnfuse.passes.kernel_lowering import NEG_INF, POS_INF, ScoreCtx
from attnfuse.passes.kv_segments import kv_segments
from attnfuse.passes.launcher_to_tl import KernelCall
from attnfuse.passes.tl_builder import KernelBuilder, Params

if TYPE_CHECKING:
    from attnfuse.passes.backward_to_tl import BackwardLowering


def dq_kernel(bl: BackwardLowering) -> KernelCall:
    """`attn_bwd_dq`: dQ of one Q block, over the KV blocks it attends to."""
    p = Params()
    kb = KernelBuilder(p, p.block)
    bm, bn = bl.block_m, bl.block_n
    qs, ks, v, do, lse_ptr, delta_ptr, lengths, block_m, block_n = bl.loop_params(p)
    nq, nk, ids = bl.program(kb, lengths, block_m)
    pid_bh, num_q_blocks, pid_m, b, h = ids.pid_bh, ids.num_q_blocks, ids.pid_m, ids.b, ids.h
    b_off, h_off, hk_off, m_start, m_off = ids.b_off, ids.h_off, ids.hk_off, ids.m_start, ids.m_off
    rows_m, offs_m, row_ok, shift, q_pos = ids.rows_m, ids.offs_m, ids.row_ok, ids.shift, ids.q_pos
    q_t = bl.tile(kb, qs, bl.base(kb, qs, b_off, h_off), m_off, rows_m, row_ok, bl.d, "q")
    do_t = bl.tile(kb, do, bl.base(kb, do, b_off, h_off), m_off, rows_m, row_ok, bl.dv, "do")
    row_base = ids.lse_row0 if ids.lse_row0 is not None else kb.add(kb.mul(kb.cast(pid_bh, i64), nq), m_off)
    row_base.name_hint = "row_base"
    lse = bl.row_stat(kb, lse_ptr, row_base, rows_m, row_ok, POS_INF, "lse")
    lse2 = kb.row(kb.mul(kb.where(kb.cmp("==", lse, NEG_INF), POS_INF, lse), LOG2E, hint="lse2"))
    delta = kb.row(bl.row_stat(kb, delta_ptr, row_base, rows_m, row_ok, 0.0, "delta"))
    k_base, v_base = bl.base(kb, ks, b_off, hk_off), bl.base(kb, v, b_off, hk_off)
    if ids.k_row0 is not None:  # the sequence's first key
        k_base = kb.add(k_base, kb.mul(ids.k_row0, ks.strides[2]), hint="k_seq")
        v_base = kb.add(v_base, kb.mul(ids.k_row0, v.strides[2]), hint="v_seq")
    q_idx = kb.row(q_pos)
    docs = {a: kb.row(t) for a, t in bl.doc_ids(kb, p, b_off, q_pos, row_ok).items()}
    q_lo = kb.add(m_start, shift, hint="q_lo")
    q_hi = kb.minimum(kb.add(q_lo, bm - 1), kb.sub(nk, 1), hint="q_hi")
    carried = {"dq": kb.full([block_m, bl.dpad], 0.0, f32, hint="dq")}
    for lo, hi, masked in kv_segments(kb, bl.kv_bounds, q_lo, q_hi, nk, bn):
        if lo is hi:
            continue

        def step(ib: KernelBuilder, start_n: SSAValue, c: dict[str, SSAValue], masked=masked):
            rows = ib.arange(block_n, hint="rows_n")
            offs_n = ib.add(start_n, rows, hint="offs_n")
            kv_ok = ib.cmp("<", offs_n, nk, hint="kv_ok") if masked else None
            n_off = ib.cast(start_n, i64, hint="n_off")
            k_t = bl.tile(ib, ks, k_base, n_off, rows, kv_ok, bl.d, "k")
            v_t = bl.tile(ib, v, v_base, n_off, rows, kv_ok, bl.dv, "v")
            s = bl.scores(ib, ib.dot(q_t, ib.emit(tl.TransOp(k_t)), None, bl.precision, hint="qk"))
            if kv_ok is not None:
                kv_ok_col = ib.col(kv_ok)
                valid = ib.and_(ib.row(row_ok), kv_ok_col)
            else:
                kv_ok_col = valid = ib.row(row_ok)
            ctx = ScoreCtx(b, h, b_off, q_idx, ib.col(offs_n), kv_ok_col, valid, docs, bl.fast_tanh)
            env: dict[SSAValue, SSAValue] = {}
            s = bl.score_ops(ib, p, s, ctx, masked, env)
            if kv_ok is not None:
                s = ib.where(kv_ok_col, s, NEG_INF, hint="s_valid")
            pr, dropped = bl.probs(ib, s, lse2, masked)
            dp = ib.dot(do_t, ib.emit(tl.TransOp(v_t)), None, bl.precision, hint="dp")
            ds = bl.score_grad(ib, p, pr, dp, delta, env, ctx, dropped)
            return {"dq": ib.dot(ib.cast(ds, bl.kdtype), k_t, c["dq"], bl.precision, hint="dq")}

        carried = kb.loop(lo, hi, block_n, carried, step)
    program = kb.add(kb.mul(pid_bh, num_q_blocks), pid_m, hint="program")
    dq = kb.mul(carried["dq"], bl.scale)
    store_gradient(bl, kb, p, bl.q, dq, b_off, h_off, m_off, rows_m, q_pos, offs_m, row_ok, program, "dq")
    p.block.add_op(tl.ReturnOp())
    return KernelCall(bl.kernel("attn_bwd_dq", p), p, bl.dq_grid(), bl.num_warps, bl.num_stages)
