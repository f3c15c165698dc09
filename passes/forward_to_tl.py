"""convert-attn-to-tl's generic forward (kernel path `triton`): the kernels of a forward
function and their launcher.

The main kernel, `attn_fwd`, is FlashAttention-2's forward: one program per (Q block,
batch x head), in three parts.
- Prologue: load the Q tile once, apply Q's transforms (RoPE, QK-norm, scale) in fp32
  and cast to the input dtype.
- KV steps, over the KV blocks causal-split allows (skipped blocks are never visited,
  full blocks carry no mask code): load a K tile (transformed here when K's placement
  is `kv_loop`), take the fp32 product, apply the score ops and masks, update the online
  softmax (base 2) and the accumulator with V. rope-fusion's `score_scale` (attn.qk's
  scale and, when `log2e_folded`, the base-2 softmax's log2 e) multiplies the fp32 product:
  before the score ops when they need natural units, else inside exp2's multiply-add; never
  the 16-bit Q tile, whose rounding would differ from the backward's and lose accuracy with
  large logits. A partial block keeps NaN or Inf in V at the keys its masks remove out of
  the rows that remove them.
- Epilogue: count the sink logit, normalise (a fully masked row gives zeros), store the
  output and the per-row log-sum-exp (natural log) for a backward.

When K's placement is `prerotate`, a second kernel, `rotate_k`, writes K's transformed
copy once, before `attn_fwd` runs. The launcher allocates the outputs, builds the RoPE
cos/sin tables and launches the kernels.

The score ops, the Q block and the pre-rotation kernel are `kernel_lowering`'s, the KV
loop's segments `kv_segments`'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.builtin import f32, i32, i64
from xdsl.ir import Operation, SSAValue

from attnfuse.dialects import tl
from attnfuse.dialects.attn import LOG2E, Placement
from attnfuse.passes.kernel_lowering import LN2, NEG_INF, POS_INF, KernelLowering, QProgram, ScoreCtx
from attnfuse.passes.kv_segments import kv_segments
from attnfuse.passes.launcher_to_tl import KernelCall, LoweredFunction, alloc_like, call_op
from attnfuse.passes.prerotate_to_tl import rotate_kernel
from attnfuse.passes.tl_builder import KernelBuilder, Params, TensorParam, pow2

NAN = float("nan")


@dataclass
class QBlock:
    """What the prologue of `attn_fwd` leaves for the KV steps and the epilogue."""

    pid_bh: SSAValue
    pid_m: SSAValue
    """The Q block."""
    b: SSAValue
    h: SSAValue
    b_off: SSAValue
    """b as int64 (the batch index that multiplies a stride)."""
    h_off: SSAValue
    """h as int64."""
    m_off: SSAValue
    """The Q block's first row, int64."""
    rows_m: SSAValue
    """Rows of the Q block relative to its first, [BLOCK_M]."""
    offs_m: SSAValue
    row_ok: SSAValue
    q_idx: SSAValue
    """Query positions, [BLOCK_M, 1]."""
    shift: SSAValue
    """Nk - Nq: the position of the first query."""
    q_tile: SSAValue
    """Q, transformed, in the input dtype."""
    k: TensorParam
    v: TensorParam
    k_base: SSAValue
    v_base: SSAValue
    offs_d: SSAValue
    offs_dv: SSAValue
    dv_ok: SSAValue | None
    """Channels of V in range; None when V's head dim is a power of two."""
    doc_q: dict[SSAValue, SSAValue]
    out: TensorParam
    lse: SSAValue
    nq: SSAValue
    nk: SSAValue
    block_m: SSAValue
    block_n: SSAValue
    lse_row0: SSAValue | None = None
    """The lse offset of the Q block's first row (None: batch x head x Nq + its row)."""
    extra: dict[str, SSAValue] = field(default_factory=dict)
    """What a kernel path's own steps read (`q_extras`), by name."""


@dataclass
class KvBlock:
    """One KV step's block of keys."""

    n_off: SSAValue
    """Its first key, int64."""
    rows_n: SSAValue
    """Its keys relative to the first, [BLOCK_N]."""
    offs_n: SSAValue
    """Its keys, [BLOCK_N]."""
    kv_ok: SSAValue | None
    """Keys below Nk; None in a full block."""
    masked: bool
    """A partial block (masks applied)."""


class ForwardLowering(KernelLowering):
    """Builds the generic kernels of one forward function and their launcher."""

    def lower(self) -> LoweredFunction:
        """The kernels (`rotate_k` when K is pre-rotated, `attn_fwd`) and the launcher."""
        calls = self.kernel_calls()
        launcher = self.launcher(calls)
        return self.lowered([c.kernel for c in calls], launcher)

    def kernel_calls(self) -> list[KernelCall]:
        """`rotate_k` (when K's placement is `prerotate`), then `attn_fwd`."""
        calls: list[KernelCall] = []
        if self.k_placement == Placement.PREROTATE:
            calls.append(rotate_kernel(self))
        calls.append(self.main_kernel())
        return calls

    # ------------------------------------------------------------------ the attention kernel
    def main_kernel(self) -> KernelCall:
        """`attn_fwd`: the prologue, a loop of KV steps per segment, the epilogue."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        qb = self.prologue(kb, p)
        carried = {
            "m_i": kb.full([qb.block_m], NEG_INF, f32, hint="m_i"),
            "l_i": kb.full([qb.block_m], 0.0, f32, hint="l_i"),
            "acc": kb.full([qb.block_m, pow2(self.dv)], 0.0, f32, hint="acc"),
            **self.carried_extras(kb),
        }
        q_lo = kb.add(kb.mul(qb.pid_m, qb.block_m), qb.shift, hint="q_lo")
        q_hi = kb.minimum(kb.add(q_lo, self.block_m - 1), kb.sub(qb.nk, 1), hint="q_hi")
        for lo, hi, masked in kv_segments(kb, self.kv_bounds, q_lo, q_hi, qb.nk, self.block_n):
            if lo is not hi:  # a segment from a bound to itself is statically empty

                def step(ib: KernelBuilder, start_n: SSAValue, c: dict[str, SSAValue], masked=masked):
                    return self.kv_step(ib, p, qb, start_n, c, masked)

                carried = kb.loop(lo, hi, qb.block_n, carried, step)
        self.epilogue(kb, p, qb, carried)
        p.block.add_op(tl.ReturnOp())
        return KernelCall(self.kernel("attn_fwd", p), p, self.grid(), self.num_warps, self.num_stages)

    def grid(self) -> list[str]:
        """`attn_fwd`'s grid: (batch x heads, Q blocks)."""
        q = self.host_name(self.chains.q_arg)
        return [f"{q}.shape[0] * {self.hq}", f"_cdiv({q}.shape[2], {self.block_m})"]

    def prologue(self, kb: KernelBuilder, p: Params) -> QBlock:
        """The kernel's parameters, the program's Q block, batch and head, and the Q tile."""
        q, k, v = self.qkv_params(p)
        out_ptr = p.param("Out", tl.PointerType(self.dtype), "out")
        out = TensorParam(out_ptr, [p.param(f"stride_o_{d}", i32, f"out.stride({d})") for d in range(4)])
        lse_ptr = p.param("Lse", tl.PointerType(f32), "lse")
        lengths = self.length_params(p)
        block_m = p.param("BLOCK_M", i32, str(self.block_m), constexpr=True)
        block_n = p.param("BLOCK_N", i32, str(self.block_n), constexpr=True)
        nq, nk, ids = self.program(kb, lengths, block_m)
        pid_bh, pid_m, b, h, b_off, h_off, hk_off = (
            ids.pid_bh,
            ids.pid_m,
            ids.b,
            ids.h,
            ids.b_off,
            ids.h_off,
            ids.hk_off,
        )
        m_off, rows_m, offs_m, row_ok, shift, q_pos = (
            ids.m_off,
            ids.rows_m,
            ids.offs_m,
            ids.row_ok,
            ids.shift,
            ids.q_pos,
        )

        offs_d = kb.arange(self.dpad, hint="offs_d")
        q_bh = kb.add(kb.add(q.ptr, kb.mul(b_off, q.strides[0])), kb.mul(h_off, q.strides[1]))
        q_base = kb.add(q_bh, kb.mul(m_off, q.strides[2]), hint="q_base")
        q_tile = self.q_tile(kb, p, q, q_base, ids, offs_d)

        k_base = kb.add(kb.add(k.ptr, kb.mul(b_off, k.strides[0])), kb.mul(hk_off, k.strides[1]), hint="k_base")
        v_base = kb.add(kb.add(v.ptr, kb.mul(b_off, v.strides[0])), kb.mul(hk_off, v.strides[1]), hint="v_base")
        if ids.k_row0 is not None:  # the sequence's first key
            k_base = kb.add(k_base, kb.mul(ids.k_row0, k.strides[2]), hint="k_seq")
            v_base = kb.add(v_base, kb.mul(ids.k_row0, v.strides[2]), hint="v_seq")
        bdv = pow2(self.dv)
        offs_dv = kb.arange(bdv, hint="offs_dv")
        dv_ok = kb.cmp("<", offs_dv, self.dv, hint="dv_ok") if bdv != self.dv else None
        q_idx = kb.row(q_pos)

        # The query's id of each document mask, loaded once.
        doc_q = {ids: kb.row(x) for ids, x in self.query_doc_ids(kb, p, b_off, q_pos, row_ok).items()}
        return QBlock(
            pid_bh=pid_bh,
            pid_m=pid_m,
            b=b,
            h=h,
            b_off=b_off,
            h_off=h_off,
            m_off=m_off,
            rows_m=rows_m,
            offs_m=offs_m,
            row_ok=row_ok,
            q_idx=q_idx,
            shift=shift,
            q_tile=q_tile,
            k=k,
            v=v,
            k_base=k_base,
            v_base=v_base,
            offs_d=offs_d,
            offs_dv=offs_dv,
            dv_ok=dv_ok,
            doc_q=doc_q,
            out=out,
            lse=lse_ptr,
            nq=nq,
            nk=nk,
            block_m=block_m,
            block_n=block_n,
            lse_row0=ids.lse_row0,
            extra=self.q_extras(kb, p, ids),
        )

    def qkv_params(self, p: Params) -> tuple[TensorParam, TensorParam, TensorParam]:
        """The tensors the kernel reads q, k and v from (K's transformed copy when it is pre-rotated)."""
        chains = self.chains
        pre = self.k_placement == Placement.PREROTATE
        q = self.tensor(p, chains.q_arg)
        k = self.tensor(p, chains.k_arg, key="k_rot" if pre else None, host="k_rot" if pre else None)
        return q, k, self.tensor(p, chains.v_arg)

    def q_tile(
        self, kb: KernelBuilder, p: Params, q: TensorParam, q_base: SSAValue, ids: QProgram, offs_d: SSAValue
    ) -> SSAValue:
        """The Q tile the products read: loaded, transformed and cast once (the scale goes on
        the fp32 scores)."""
        chains = self.chains

        def load_q(chans: SSAValue, hint: str = "q") -> SSAValue:
            return self.qk.load_tile(kb, q_base, ids.rows_m, ids.row_ok, q.strides[2], q.strides[3], chans, True, hint)

        if not chains.q_chain:
            return load_q(offs_d, "q_tile")
        q_x = self.qk.transformed(
            kb,
            p,
            chains.q_chain,
            load_q,
            self.positions(kb, p, chains.q_chain, ids.q_pos, ids.b_off, ids.offs_m, ids.row_ok),
            ids.row_ok,
            True,
            "q",
            signed_pos=True,
        )
        return kb.cast(q_x, self.dtype, hint="q_tile")

    def q_extras(self, kb: KernelBuilder, p: Params, ids: QProgram) -> dict[str, SSAValue]:
        """Values a kernel path's KV steps read, built once in the prologue (none here)."""
        return {}

    def kv_step(
        self, ib: KernelBuilder, p: Params, qb: QBlock, start_n: SSAValue, c: dict[str, SSAValue], masked: bool
    ) -> dict[str, SSAValue]:
        """One KV block: scores, score ops (and masks when `masked`), the online softmax
        update in base 2, and P @ V into the accumulator."""
        rows_n = ib.arange(qb.block_n, hint="rows_n")
        offs_n = ib.add(start_n, rows_n, hint="offs_n")
        kv_ok = ib.cmp("<", offs_n, qb.nk, hint="kv_ok") if masked else None
        n_off = ib.cast(start_n, i64, hint="n_off")
        k = qb.k
        k_blk = ib.add(qb.k_base, ib.mul(n_off, k.strides[2]), hint="k_blk")

        def load_k(chans: SSAValue) -> SSAValue:
            return self.qk.load_tile(ib, k_blk, rows_n, kv_ok, k.strides[2], k.strides[3], chans, False, "k")

        if self.k_placement == Placement.KV_LOOP:
            k_pos = self.positions(ib, p, self.chains.k_chain, offs_n, qb.b_off, offs_n, kv_ok)
            k_x = self.qk.transformed(ib, p, self.chains.k_chain, load_k, k_pos, kv_ok, False, "k")
            k_tile = ib.cast(k_x, self.kdtype, hint="k_tile")
        else:
            k_tile = load_k(qb.offs_d)
        blk = KvBlock(n_off, rows_n, offs_n, kv_ok, masked)
        s = self.scores(ib, self.product(ib, qb, k_tile, blk))
        kv_idx = ib.col(offs_n)
        if masked:
            assert kv_ok is not None
            kv_ok_col = ib.col(kv_ok)
            valid = ib.and_(ib.row(qb.row_ok), kv_ok_col)
        else:
            kv_ok_col = valid = ib.row(qb.row_ok)
        ctx = ScoreCtx(qb.b, qb.h, qb.b_off, qb.q_idx, kv_idx, kv_ok_col, valid, qb.doc_q, self.fast_tanh)
        s = self.score_ops(ib, p, s, ctx, masked)
        if masked:
            s = ib.where(kv_ok_col, s, NEG_INF, hint="s_valid")
        m_new, l_new, pr, acc_s = self.online_softmax(ib, s, c)
        return {"m_i": m_new, "l_i": l_new, **self.pv(ib, qb, blk, s, pr, acc_s, c)}

    def carried_extras(self, kb: KernelBuilder) -> dict[str, SSAValue]:
        """Values a kernel path's KV steps carry besides m_i, l_i and acc, initialised (none here)."""
        return {}

    def product(self, ib: KernelBuilder, qb: QBlock, k_tile: SSAValue, blk: KvBlock) -> SSAValue:
        """Q·Kᵀ of the block, fp32."""
        return ib.dot(qb.q_tile, k_tile, None, self.precision, hint="qk")

    def v_tile(self, ib: KernelBuilder, qb: QBlock, blk: KvBlock, hint: str = "v") -> SSAValue:
        """The block's V tile [BLOCK_N, Dv], zero past Nk (and past Dv)."""
        v = qb.v
        v_blk = ib.add(qb.v_base, ib.mul(blk.n_off, v.strides[2]), hint="v_blk")
        v_ptr = ib.add(
            ib.add(v_blk, ib.mul(ib.row(blk.rows_n), v.strides[2])),
            ib.mul(ib.col(qb.offs_dv), v.strides[3]),
            hint="v_ptr",
        )
        vmask = ib.row(blk.kv_ok) if blk.kv_ok is not None else None
        if qb.dv_ok is not None:
            vmask = ib.col(qb.dv_ok) if vmask is None else ib.and_(vmask, ib.col(qb.dv_ok))
        return ib.load(v_ptr, vmask, 0.0, hint=hint)

    def pv(
        self,
        ib: KernelBuilder,
        qb: QBlock,
        blk: KvBlock,
        s: SSAValue,
        pr: SSAValue,
        acc_s: SSAValue,
        c: dict[str, SSAValue],
    ) -> dict[str, SSAValue]:
        """The carried values P·V updates (`c`: the step's): `acc`, the accumulator `acc_s`
        (rescaled) plus the block's P·V."""
        vv = self.v_tile(ib, qb, blk)
        if not blk.masked:
            return {"acc": ib.dot(ib.cast(pr, self.vdtype), vv, acc_s, self.precision, hint="acc_new")}
        # A partial block reads V only where the mask keeps the key: a NaN or Inf at a masked
        # key (garbage in an unused cache slot) must not reach a row as 0 * NaN. Non-finite
        # values are zeroed for the product, and the rows and channels that keep such a key
        # get NaN, as in a full block: a second product of the keep mask with the non-finite
        # pattern (tensor cores; reductions across the tile's warps cost more).
        v_ok = ib.cmp("<", ib.unary(tl.AbsOp, vv), POS_INF, hint="v_finite")  # false for NaN too
        v_clean = ib.where(v_ok, vv, 0.0, hint="v_clean")
        acc_n = ib.dot(ib.cast(pr, self.vdtype), v_clean, acc_s, self.precision, hint="acc_new")
        kept = ib.where(ib.cmp("!=", s, NEG_INF), 1.0, 0.0, hint="kept")
        v_bad = ib.where(v_ok, 0.0, 1.0, hint="v_bad")
        hits = ib.dot(ib.cast(kept, self.vdtype), ib.cast(v_bad, self.vdtype), None, self.precision, hint="v_bad_hits")
        return {"acc": ib.where(ib.cmp(">", hits, 0.0), NAN, acc_n, hint="acc_new")}

    def epilogue(self, kb: KernelBuilder, p: Params, qb: QBlock, carried: dict[str, SSAValue]) -> None:
        """Count the sink, normalise, store the output and the log-sum-exp."""
        m_i, l_i, acc = carried["m_i"], carried["l_i"], self.final_acc(kb, carried)
        sink_arg = self.chains.softmax.sink
        if sink_arg is not None:
            sink = self.tensor(p, sink_arg)
            sk = kb.mul(
                kb.cast(kb.load(kb.add(sink.ptr, kb.mul(qb.h_off, sink.strides[0])), hint="sink"), f32),
                LOG2E,
                hint="sink2",
            )
            m_new = kb.maximum(m_i, sk, hint="m_sink")
            alpha = kb.unary(tl.Exp2Op, kb.sub(m_i, m_new))
            l_i = kb.add(kb.mul(l_i, alpha), kb.unary(tl.Exp2Op, kb.sub(sk, m_new)), hint="l_sink")
            acc = kb.mul(acc, kb.row(alpha))
            m_i = m_new
        empty = kb.cmp("==", l_i, 0.0, hint="empty_row")
        l_safe = kb.where(empty, 1.0, l_i, hint="l_safe")
        out = kb.cast(kb.div(acc, kb.row(l_safe)), self.dtype, hint="out")
        o = qb.out
        o_bh = kb.add(kb.add(o.ptr, kb.mul(qb.b_off, o.strides[0])), kb.mul(qb.h_off, o.strides[1]))
        o_base = kb.add(o_bh, kb.mul(qb.m_off, o.strides[2]), hint="o_base")
        o_ptr = kb.add(
            o_base,
            kb.add(kb.mul(kb.row(qb.rows_m), o.strides[2]), kb.mul(kb.col(qb.offs_dv), o.strides[3])),
            hint="o_ptr",
        )
        omask = kb.row(qb.row_ok)
        if qb.dv_ok is not None:
            omask = kb.and_(omask, kb.col(qb.dv_ok))
        kb.store(o_ptr, out, omask)
        # log2 of l_safe, not l: an empty row's lse is -inf without evaluating log2(0).
        lse = kb.mul(kb.add(m_i, kb.unary(tl.Log2Op, l_safe)), LN2)
        lse = kb.where(empty, NEG_INF, lse, hint="lse")
        lse_row = qb.lse_row0 if qb.lse_row0 is not None else kb.add(kb.mul(kb.cast(qb.pid_bh, i64), qb.nq), qb.m_off)
        kb.store(kb.add(kb.add(qb.lse, lse_row, hint="lse_base"), qb.rows_m), lse, qb.row_ok)

    def final_acc(self, kb: KernelBuilder, carried: dict[str, SSAValue]) -> SSAValue:
        """The accumulator of unnormalised outputs after the last KV step."""
        return carried["acc"]

    # ------------------------------------------------------------------ the launcher
    def launcher(self, calls: list[KernelCall]) -> tl.LauncherOp:
        """`launch`: allocate the outputs (and `scratch_allocs`), build the RoPE tables, run the
        kernels in order (each by `launch_ops`, the last by `main_launch`), return (out, lse)."""
        q = self.host_name(self.chains.q_arg)
        ops: list[Operation] = [
            alloc_like("out", q, self.hq, self.dv, self.dtype, ordered=True),
            tl.AllocOp(
                "lse", [f"{q}.shape[0]", str(self.hq), f"{q}.shape[2]"], "torch.float32", f"{q}.device", given=True
            ),
        ]
        ops += self.scratch_allocs()
        ops += self.rope_host_ops(f"{q}.device")
        for c in calls[:-1]:
            ops += self.launch_ops(c)
        ops.append(self.main_launch(call_op(calls[-1])))
        ops.append(tl.HostReturnOp(["out", "lse"]))
        return tl.LauncherOp("launch", self.launcher_params(), ops)

    def scratch_allocs(self) -> list[Operation]:
        """The launcher's tensors for the kernels before the attention: K's transformed copy when
        it is pre-rotated."""
        if self.k_placement != Placement.PREROTATE:
            return []
        return [alloc_like("k_rot", self.host_name(self.chains.k_arg), self.hkv, self.d, self.kdtype)]

    def launch_ops(self, c: KernelCall) -> list[Operation]:
        """The launcher's ops for one kernel before the attention: its launch."""
        return [call_op(c)]

    def launcher_params(self) -> list[str]:
        """The launcher's parameters: the function's arguments."""
        return list(self.names)

    def main_launch(self, generic: tl.CallOp) -> Operation:
        """How the launcher runs the attention: here the generic kernel's launch as it is
        (a kernel path with a kernel of its own chooses between the two per call)."""
        return generic
