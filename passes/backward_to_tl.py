"""convert-attn-to-tl's backward: the kernels of a backward function (attn-autodiff's).

FlashAttention-2's backward, with the blocks' derivatives fused:

- `attn_bwd_pre`: delta = rowsum(dout * out) per query row (and, for a learned sink,
  each program's share of the sink's gradient);
- `rotate_q` / `rotate_k`: Q's and K's transforms (RoPE, QK-norm, scale), applied once
  (rope-fusion places a backward's transforms there);
- `attn_bwd_dkdv`: one program per (KV block, batch x kv head) walks the Q blocks of every
  query head of its group (GQA sums in registers, no atomics: deterministic), recomputes
  P^T from the saved log-sum-exp, and accumulates dV = P^T dO and dK = dS^T Q; its
  epilogue applies K's derivatives (the inverse rotation, the RMSNorm backward) before
  storing dK;
- `attn_bwd_dq`: one program per (Q block, batch x head) walks the KV blocks and
  accumulates dQ = dS K; its epilogue applies Q's derivatives.

Both loops visit only the blocks causal-split allows, and full blocks carry no mask code
(`kv_segments` and its transpose `q_segments`). The score gradient dS = P (dP - delta) goes
back through the score ops' derivatives as the IR gives them (`attn.scale`,
`attn.score_mod` regions, `attn.score_mul`). Learned weights' gradients (QK-norm) are
written per program and summed by the launcher (`tl.host_sum`), again deterministically.

Block sizes (`attn.tiling` of class `bwd`): BLOCK_M rows are owned by a program (keys in
dK/dV, queries in dQ), BLOCK_N rows are one step of its loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, TensorType, f32, i32, i64
from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.dialects.attn import LOG2E
from attnfuse.dialects.tl import dtype_name
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.convert_attn_to_tl import NEG_INF, KernelCall, Lowering, ScoreCtx
from attnfuse.passes.kv_segments import kv_segments, q_segments
from attnfuse.passes.qk_transforms_to_tl import RopeLayout
from attnfuse.passes.tl_builder import KernelBuilder, Params, TensorParam, pow2

POS_INF = float("inf")

ChainGrad = attn.ScaleOp | attn.RopeGradOp | attn.NormGradOp | attn.NormWeightGradOp


@dataclass
class GradPlan:
    """The derivative ops of a backward function, by role."""

    wrt: list[int]
    returned: list[SSAValue]
    softmax_grad: attn.SoftmaxGradOp | None
    """None when only dV (and the sink) are asked for."""
    sink_grad: attn.SinkGradOp | None
    score_grads: list[Operation]
    """attn.scale / attn.score_mod / attn.score_mul on score gradients, in order."""
    qk_grad: attn.QKGradOp | None
    q_grads: list[ChainGrad] = field(default_factory=list)
    k_grads: list[ChainGrad] = field(default_factory=list)

    @staticmethod
    def of(chains: AttentionChains) -> GradPlan:
        f = chains.func
        wrt_attr = f.attributes["attn.wrt"]
        assert isinstance(wrt_attr, DenseArrayBase)
        ret = f.body.block.last_op
        assert isinstance(ret, func.ReturnOp)
        ops = list(f.body.block.ops)
        first = ops.index(chains.pv) + 1
        softmax_grad = sink_grad = qk_grad = None
        score_grads: list[Operation] = []
        chain_ops: list[ChainGrad] = []
        for op in ops[first:-1]:
            if isinstance(op, attn.SoftmaxGradOp):
                softmax_grad = op
            elif isinstance(op, attn.SinkGradOp):
                sink_grad = op
            elif isinstance(op, attn.QKGradOp):
                qk_grad = op
            elif isinstance(op, attn.ScaleOp | attn.RopeGradOp | attn.NormGradOp | attn.NormWeightGradOp) and (
                not isinstance(op.operands[0].type, attn.ScoresType)
            ):
                chain_ops.append(op)
            elif isinstance(op, attn.ScaleOp | attn.ScoreModOp | attn.ScoreMulOp):
                score_grads.append(op)
            else:
                raise DiagnosticException(f"'{op.name}' cannot appear in the derivative part of a backward function")
        plan = GradPlan(
            [int(x) for x in wrt_attr.get_values()],
            list(ret.operands),
            softmax_grad,
            sink_grad,
            score_grads,
            qk_grad,
        )
        if qk_grad is not None:
            for side, start in ((plan.q_grads, qk_grad.dq), (plan.k_grads, qk_grad.dk)):
                side.extend(_chain_from(start, chain_ops))
        return plan

    def needs(self, value: SSAValue | None) -> bool:
        return value is not None and bool(value.uses)


def _chain_from(start: SSAValue, ops: list[ChainGrad]) -> list[ChainGrad]:
    """The ops of `ops` that transform `start`'s gradient, in order (a norm's weight
    gradient reads the same value as its attn.norm_grad)."""
    chain: list[ChainGrad] = []
    current = start
    for op in ops:
        if op.operands[0] is current:
            chain.append(op)
            if not isinstance(op, attn.NormWeightGradOp):
                current = op.results[0]
    return chain


@dataclass
class Side:
    """One of q and k in a backward kernel: its tensors and how its tiles are read."""

    arg: SSAValue
    """The function argument (q or k)."""
    chain: list[Operation]
    """Its forward transforms."""
    grads: list[ChainGrad]
    """Their derivatives, in order."""
    heads: int
    dtype: object
    pre: bool
    """Read from the pre-transformed copy (`q_rot` / `k_rot`)."""
    signed_pos: bool


class BackwardLowering(Lowering):
    """Builds the kernels and the launcher of one backward function."""

    def __init__(self, chains: AttentionChains, arg_names: list[str]):
        super().__init__(chains, arg_names)
        self.plan = GradPlan.of(chains)
        self.scale = chains.qk.effective_scale
        self.q = Side(chains.q_arg, chains.q_chain, self.plan.q_grads, self.hq, self.dtype, bool(chains.q_chain), True)
        self.k = Side(
            chains.k_arg, chains.k_chain, self.plan.k_grads, self.hkv, self.kdtype, bool(chains.k_chain), False
        )
        qk = self.plan.qk_grad
        self.need_dq = qk is not None and self.plan.needs(qk.dq)
        self.need_dk = qk is not None and self.plan.needs(qk.dk)
        self.need_dv = self.plan.needs(chains.pv.results[1])
        self.guard = any(isinstance(op, attn.ScoreMulOp) for op in self.plan.score_grads)
        self.log2e_folded = all(isinstance(op, attn.ScaleOp | attn.MaskOp) for op in chains.score_ops)
        """Every score op is linear (or a mask): LOG2E joins the scores' scale, so the scores
        come out in base 2 for exp2, as the forward's `log2e_folded`."""
        self.score_scale = self.scale * (LOG2E if self.log2e_folded else 1.0)
        """The factor on the fp32 scores, as the forward's: the 16-bit tiles go into the
        product unscaled, so P is recomputed under the forward's rounding."""
        self.partials: list[str] = []
        """The buffers of the learned weights' per-program gradients."""

    # ------------------------------------------------------------------ helpers
    def host_of(self, index_from_end: int) -> str:
        """Launcher name of out (3), lse (2) or dout (1): the function's last arguments."""
        args = self.chains.func.body.block.args
        return self.host_name(args[len(args) - index_from_end])

    def out_tensor(self, p: Params, key: str, host: str, rank: int = 4) -> TensorParam:
        ptr = p.param(key, tl.PointerType(f32), host)
        return TensorParam(ptr, [p.param(f"stride_{key}_{d}", i32, f"{host}.stride({d})") for d in range(rank)])

    def typed_tensor(self, p: Params, key: str, host: str, element: object) -> TensorParam:
        ptr = p.param(key, tl.PointerType(element), host)  # type: ignore[arg-type]
        return TensorParam(ptr, [p.param(f"stride_{key}_{d}", i32, f"{host}.stride({d})") for d in range(4)])

    def source(self, p: Params, side: Side) -> TensorParam:
        """Where the kernel reads q or k tiles from (the pre-transformed copy if any)."""
        name = "q" if side is self.q else "k"
        if side.pre:
            return self.typed_tensor(p, f"{name}_rot", f"{name}_rot", side.dtype)
        return self.tensor(p, side.arg)

    @staticmethod
    def base(kb: KernelBuilder, t: TensorParam, b_off: SSAValue, h_off: SSAValue) -> SSAValue:
        return kb.add(kb.add(t.ptr, kb.mul(b_off, t.strides[0])), kb.mul(h_off, t.strides[1]))

    @staticmethod
    def tile_ptr(
        kb: KernelBuilder,
        t: TensorParam,
        base: SSAValue,
        row_off: SSAValue,
        rows: SSAValue,
        ok: SSAValue | None,
        width: int,
    ) -> tuple[SSAValue, SSAValue | None]:
        """Pointers and mask of a [rows, width] tile of `t` from row `row_off` of `base`
        (rows where `ok` is false and channels past `width` masked off)."""
        offs = kb.arange(pow2(width))
        ptr = kb.add(
            kb.add(kb.add(base, kb.mul(row_off, t.strides[2])), kb.mul(kb.row(rows), t.strides[2])),
            kb.mul(kb.col(offs), t.strides[3]),
        )
        mask = kb.row(ok) if ok is not None else None
        if pow2(width) != width:
            cmask = kb.col(kb.cmp("<", offs, width))
            mask = cmask if mask is None else kb.and_(mask, cmask)
        return ptr, mask

    def tile(
        self,
        kb: KernelBuilder,
        t: TensorParam,
        base: SSAValue,
        row_off: SSAValue,
        rows: SSAValue,
        ok: SSAValue | None,
        width: int,
        hint: str,
    ) -> SSAValue:
        """Load a [rows, width] tile (masked elements read 0)."""
        ptr, mask = self.tile_ptr(kb, t, base, row_off, rows, ok, width)
        return kb.load(ptr, mask, 0.0, hint=hint)

    def store_tile(
        self,
        kb: KernelBuilder,
        t: TensorParam,
        base: SSAValue,
        row_off: SSAValue,
        rows: SSAValue,
        ok: SSAValue,
        width: int,
        value: SSAValue,
    ) -> None:
        ptr, mask = self.tile_ptr(kb, t, base, row_off, rows, ok, width)
        kb.store(ptr, value, mask)

    def row_stat(
        self,
        kb: KernelBuilder,
        ptr: SSAValue,
        row_base: SSAValue,
        offs: SSAValue,
        ok: SSAValue,
        other: float,
        hint: str,
    ) -> SSAValue:
        """A per-query-row float32 vector (lse, delta) at rows `offs`."""
        return kb.load(kb.add(kb.add(ptr, row_base), offs), ok, other, hint=hint)

    def doc_ids(
        self, kb: KernelBuilder, p: Params, b_off: SSAValue, q_pos: SSAValue, ok: SSAValue
    ) -> dict[SSAValue, SSAValue]:
        """The queries' ids of each document mask, as a 1-D tile over `q_pos`."""
        ids_of: dict[SSAValue, SSAValue] = {}
        for mask in self.chains.masks:
            if mask.kind.data == "document":
                ids = self.tensor(p, mask.extras[0])
                base = kb.add(ids.ptr, kb.mul(b_off, ids.strides[0]))
                ids_of[mask.extras[0]] = kb.load(
                    kb.add(base, kb.mul(kb.cast(q_pos, i64), ids.strides[1])), ok, -1, hint="doc_q"
                )
        return ids_of

    @staticmethod
    def dropped(kb: KernelBuilder, s: SSAValue) -> SSAValue:
        """Where a partial block's masks removed the score (-inf): P is exactly 0 there, not
        exp2(-inf - lse) = NaN in a row whose lse a NaN query made NaN."""
        return kb.cmp("==", s, NEG_INF, hint="dropped")

    def base2(self, kb: KernelBuilder, s: SSAValue) -> SSAValue:
        """The scores in base 2 (already so when LOG2E is in the scores' scale)."""
        return s if self.log2e_folded else kb.mul(s, LOG2E, hint="s2")

    # ------------------------------------------------------------------ the score gradient
    def score_grad(
        self,
        kb: KernelBuilder,
        p: Params,
        pr: SSAValue,
        dp: SSAValue,
        delta: SSAValue,
        env: dict[SSAValue, SSAValue],
        ctx: ScoreCtx,
        dropped: SSAValue | None = None,
    ) -> SSAValue:
        """dS = P (dP - delta), then back through the score ops' derivatives; zero where P is
        zero (a derivative evaluated at a masked or out-of-range score may not be finite).

        `dropped`, in a partial block, is where the masks remove a score: dS is zero there
        whatever dP and delta hold (a NaN in V at a masked key makes dP NaN, a NaN query's
        row has a NaN delta), as autograd of the reference's `where(mask, s, -inf)` gives."""
        assert self.plan.qk_grad is not None and self.plan.softmax_grad is not None
        env[self.plan.softmax_grad.ds] = kb.mul(pr, kb.sub(dp, delta), hint="ds")
        for op in self.plan.score_grads:
            if isinstance(op, attn.ScaleOp):
                env[op.output] = kb.mul(env[op.input], op.value.value.data)
            elif isinstance(op, attn.ScoreModOp):
                env[op.output] = self.region(kb, p, op, ctx, env[op.input])
            elif isinstance(op, attn.ScoreMulOp):
                env[op.output] = kb.mul(env[op.lhs], env[op.rhs], hint="ds")
        ds = env[self.plan.qk_grad.ds]
        if self.guard:
            ds = kb.where(kb.cmp("==", pr, 0.0), 0.0, ds, hint="ds")
        if dropped is not None:
            ds = kb.where(dropped, 0.0, ds, hint="ds_kept")
        return ds

    # ------------------------------------------------------------------ the chains' derivatives
    def chain_grad(
        self,
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
    ) -> SSAValue:
        """Apply `side`'s derivative ops to the gradient tile `g` [rows, head dim] (fp32);
        `load(channels)` reads the untransformed tile, `program` indexes weight partials."""
        normed: dict[SSAValue, tuple[SSAValue, SSAValue]] = {}
        """x and its rsqrt(mean(x^2) + eps) per norm input: a norm's weight gradient and its
        input gradient read the same ones."""
        for op in side.grads:
            if isinstance(op, attn.ScaleOp):
                g = kb.mul(g, op.value.value.data)
            elif isinstance(op, attn.RopeGradOp):
                g = self.rope_grad(kb, p, op, g, pos, ok, rows, prefix)
            else:
                if op.operands[1] not in normed:
                    x = self.forward_value(kb, p, side, op.operands[1], load, pos, ok, prefix)
                    total = kb.reduce("sum", kb.mul(x, x), 1)
                    eps = op.eps.value.data
                    normed[op.operands[1]] = (
                        x,
                        kb.unary(tl.RsqrtOp, kb.add(kb.div(total, float(self.d)), eps), hint=f"{prefix}_rstd"),
                    )
                x, r = normed[op.operands[1]]
                if isinstance(op, attn.NormWeightGradOp):
                    part = kb.reduce("sum", kb.mul(kb.mul(g, x), kb.row(r)), 0, hint=f"{prefix}_dw")
                    self.store_partial(kb, p, op.dweight, part, program)
                    continue
                gw = g
                if op.weight is not None:
                    w = self.tensor(p, op.weight)
                    offs = kb.arange(self.dpad)
                    dmask = kb.cmp("<", offs, self.d) if self.dpad != self.d else None
                    gw = kb.mul(g, kb.col(kb.cast(kb.load(kb.add(w.ptr, kb.mul(offs, w.strides[0])), dmask, 0.0), f32)))
                proj = kb.div(kb.mul(kb.reduce("sum", kb.mul(gw, x), 1), kb.mul(r, r)), float(self.d))
                g = kb.mul(kb.row(r), kb.sub(gw, kb.mul(x, kb.row(proj))), hint=f"{prefix}_dnorm")
        return g

    def forward_value(
        self,
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
        return self.qk.transformed(kb, p, side.chain[:upto], load, pos, ok, True, f"{prefix}_x", side.signed_pos)

    def rope_grad(
        self,
        kb: KernelBuilder,
        p: Params,
        op: attn.RopeGradOp,
        g: SSAValue,
        pos: SSAValue,
        ok: SSAValue,
        rows: SSAValue,
        prefix: str,
    ) -> SSAValue:
        """g rotated back: g * cos - partner(g) * sign * sin, i.e. the rotation at -pos."""
        layout = RopeLayout(op.style_name, op.rotary_dim.value.data)
        offs_d, partner = self.qk.channels(kb, layout)
        assert partner is not None
        index = kb.add(kb.mul(kb.row(rows), 0), kb.col(partner), hint=f"{prefix}_partner")
        gp = kb.emit(tl.GatherOp(g, index, 1), f"{prefix}_gp")
        neg = kb.sub(0, pos, hint=f"{prefix}_neg_pos")
        return self.qk.rotated(kb, p, op, layout, g, gp, offs_d, neg, ok, True, f"{prefix}_back", True)

    def store_partial(self, kb: KernelBuilder, p: Params, dweight: SSAValue, part: SSAValue, program: SSAValue) -> None:
        """Write one program's share of a learned weight's gradient: a row of a float32
        [programs, head dim] buffer that the launcher sums."""
        index = self.plan.wrt[self.plan.returned.index(dweight)]
        name = f"grad_{index}"
        ptr = p.param(f"{name}_part", tl.PointerType(f32), f"{name}_part")
        offs = kb.arange(self.dpad)
        dmask = kb.cmp("<", offs, self.d) if self.dpad != self.d else None
        kb.store(kb.add(kb.add(ptr, kb.mul(kb.cast(program, i64), self.dpad)), offs), part, dmask)
        if f"{name}_part" not in self.partials:
            self.partials.append(f"{name}_part")

    # ------------------------------------------------------------------ kernels
    def loop_params(self, p: Params) -> tuple:
        """The parameters the dK/dV and dQ kernels share: the q and k tiles' sources, v, dout,
        lse, delta, NQ, NK, BLOCK_M and BLOCK_N."""
        qs, ks, v = self.source(p, self.q), self.source(p, self.k), self.tensor(p, self.chains.v_arg)
        do = self.typed_tensor(p, "dout", self.host_of(1), self.dtype)
        lse_ptr = p.param("Lse", tl.PointerType(f32), self.host_of(2))
        delta_ptr = p.param("Delta", tl.PointerType(f32), "delta")
        q_name, k_name = self.host_name(self.chains.q_arg), self.host_name(self.chains.k_arg)
        nq = p.param("NQ", i32, f"{q_name}.shape[2]")
        nk = p.param("NK", i32, f"{k_name}.shape[2]")
        block_m = p.param("BLOCK_M", i32, str(self.block_m), constexpr=True)
        block_n = p.param("BLOCK_N", i32, str(self.block_n), constexpr=True)
        return qs, ks, v, do, lse_ptr, delta_ptr, nq, nk, block_m, block_n

    def pre_kernel(self) -> KernelCall:
        """`attn_bwd_pre`: delta = rowsum(dout * out); with a sink, each program's share of
        -sum(exp(sink - lse) * delta)."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        out_name, lse_name, dout_name = self.host_of(3), self.host_of(2), self.host_of(1)
        o = self.typed_tensor(p, "out", out_name, self.dtype)
        do = self.typed_tensor(p, "dout", dout_name, self.dtype)
        delta_ptr = p.param("Delta", tl.PointerType(f32), "delta")
        nq = p.param("NQ", i32, f"{out_name}.shape[2]")
        block = p.param("BLOCK", i32, "64", constexpr=True)
        pid_m = kb.emit(tl.ProgramIdOp(0), "pid_m")
        pid_bh = kb.emit(tl.ProgramIdOp(1), "pid_bh")
        b_off = kb.cast(kb.floordiv(pid_bh, self.hq), i64, hint="b_off")
        h_off = kb.cast(kb.rem(pid_bh, self.hq), i64, hint="h_off")
        m_start = kb.mul(pid_m, block, hint="m_start")
        m_off = kb.cast(m_start, i64)
        rows = kb.arange(block, hint="rows")
        ok = kb.cmp("<", kb.add(m_start, rows), nq, hint="row_ok")
        o_t = kb.cast(self.tile(kb, o, self.base(kb, o, b_off, h_off), m_off, rows, ok, self.dv, "o"), f32)
        do_t = kb.cast(self.tile(kb, do, self.base(kb, do, b_off, h_off), m_off, rows, ok, self.dv, "do"), f32)
        delta = kb.reduce("sum", kb.mul(o_t, do_t), 1, hint="delta")
        row_base = kb.add(kb.mul(kb.cast(pid_bh, i64), nq), m_off, hint="row_base")
        kb.store(kb.add(kb.add(delta_ptr, row_base), rows), delta, ok)
        sink_grad = self.plan.sink_grad
        if sink_grad is not None and self.plan.needs(sink_grad.dsink):
            lse_ptr = p.param("Lse", tl.PointerType(f32), lse_name)
            sink = self.tensor(p, sink_grad.sink)
            sk = kb.cast(kb.load(kb.add(sink.ptr, kb.mul(h_off, sink.strides[0])), hint="sink"), f32)
            lse = kb.load(kb.add(kb.add(lse_ptr, row_base), rows), ok, 0.0, hint="lse")
            share = kb.where(ok, kb.mul(kb.unary(tl.ExpOp, kb.sub(sk, lse)), delta), 0.0)
            part_ptr = p.param("DSink_part", tl.PointerType(f32), "dsink_part")
            programs = kb.add(kb.mul(kb.cast(pid_bh, i64), kb.emit(tl.NumProgramsOp(0))), kb.cast(pid_m, i64))
            kb.store(kb.add(part_ptr, programs), kb.sub(0.0, kb.reduce("sum", share, 0)))
        p.block.add_op(tl.ReturnOp())
        grid = [f"_cdiv({out_name}.shape[2], 64)", f"{out_name}.shape[0] * {self.hq}"]
        return KernelCall(self.kernel("attn_bwd_pre", p), p, grid, 4, 1)

    def dkdv_kernel(self) -> KernelCall:
        """`attn_bwd_dkdv`: dK and dV of one KV block, over the Q blocks of its query heads."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        bkey, bq = self.block_m, self.block_n
        qs, ks, v, do, lse_ptr, delta_ptr, nq, nk, block_m, block_n = self.loop_params(p)
        pid_n = kb.emit(tl.ProgramIdOp(0), "pid_n")
        pid_bh = kb.emit(tl.ProgramIdOp(1), "pid_bh")
        b = kb.floordiv(pid_bh, self.hkv, hint="b")
        hk = kb.rem(pid_bh, self.hkv, hint="h_kv")
        b_off, hk_off = kb.cast(b, i64, hint="b_off"), kb.cast(hk, i64, hint="hk_off")
        n_start = kb.mul(pid_n, block_m, hint="n_start")
        n_off = kb.cast(n_start, i64, hint="n_off")
        rows_n = kb.arange(block_m, hint="rows_n")
        offs_n = kb.add(n_start, rows_n, hint="offs_n")
        kv_ok = kb.cmp("<", offs_n, nk, hint="kv_ok")
        k_base = self.base(kb, ks, b_off, hk_off)
        k_t = self.tile(kb, ks, k_base, n_off, rows_n, kv_ok, self.d, "k")
        v_base = self.base(kb, v, b_off, hk_off)
        v_t = self.tile(kb, v, v_base, n_off, rows_n, kv_ok, self.dv, "v")
        shift = kb.sub(nk, nq, hint="q_shift")
        k_hi = kb.minimum(kb.add(n_start, bkey - 1), kb.sub(nk, 1), hint="k_hi")
        segments = q_segments(kb, self.kv_bounds, n_start, k_hi, shift, nq, bq)
        group = self.hq // self.hkv
        carried = {
            "dk": kb.full([block_m, self.dpad], 0.0, f32, hint="dk"),
            "dv": kb.full([block_m, pow2(self.dv)], 0.0, f32, hint="dv"),
        }
        kv_idx = kb.row(offs_n)

        def head(hb: KernelBuilder, hg: SSAValue | None, c: dict[str, SSAValue]) -> dict[str, SSAValue]:
            h = hk if hg is None else hb.add(hb.mul(hk, group), hg, hint="h")
            h_off = hb.cast(h, i64, hint="h_off")
            q_base = self.base(hb, qs, b_off, h_off)
            do_base = self.base(hb, do, b_off, h_off)
            row_base = hb.mul(hb.add(hb.mul(b_off, self.hq), h_off), nq, hint="row_base")
            for lo, hi, masked in segments:

                def step(ib: KernelBuilder, start_m: SSAValue, c: dict[str, SSAValue], masked=masked):
                    rows = ib.arange(block_n, hint="rows_m")
                    offs_m = ib.add(start_m, rows, hint="offs_m")
                    row_ok = ib.cmp("<", offs_m, nq, hint="row_ok")
                    m_off = ib.cast(start_m, i64, hint="m_off")
                    q_t = self.tile(ib, qs, q_base, m_off, rows, row_ok, self.d, "q")
                    s = ib.mul(ib.dot(k_t, ib.emit(tl.TransOp(q_t)), None, self.precision), self.score_scale, hint="s")
                    q_pos = ib.add(offs_m, shift, hint="q_pos")
                    docs = {a: ib.col(t) for a, t in self.doc_ids(ib, p, b_off, q_pos, row_ok).items()}
                    valid = ib.and_(ib.row(kv_ok), ib.col(row_ok))
                    ctx = ScoreCtx(b, h, b_off, ib.col(q_pos), kv_idx, ib.row(kv_ok), valid, docs, self.fast_tanh)
                    env: dict[SSAValue, SSAValue] = {}
                    s = self.score_ops(ib, p, s, ctx, masked, env)
                    lse = self.row_stat(ib, lse_ptr, row_base, offs_m, row_ok, POS_INF, "lse")
                    lse2 = ib.mul(ib.where(ib.cmp("==", lse, NEG_INF), POS_INF, lse), LOG2E, hint="lse2")
                    pt = ib.unary(tl.Exp2Op, ib.sub(self.base2(ib, s), ib.col(lse2)), hint="p")
                    dropped = self.dropped(ib, s) if masked else None
                    pt = ib.where(dropped, 0.0, pt, hint="p_kept") if dropped is not None else pt
                    do_t = self.tile(ib, do, do_base, m_off, rows, row_ok, self.dv, "do")
                    new = dict(c)
                    if self.need_dv:
                        new["dv"] = ib.dot(ib.cast(pt, self.dtype), do_t, c["dv"], self.precision, hint="dv")
                    if self.need_dk:
                        dp = ib.dot(v_t, ib.emit(tl.TransOp(do_t)), None, self.precision, hint="dp")
                        delta = self.row_stat(ib, delta_ptr, row_base, offs_m, row_ok, 0.0, "delta")
                        ds = self.score_grad(ib, p, pt, dp, ib.col(delta), env, ctx, dropped)
                        new["dk"] = ib.dot(ib.cast(ds, self.dtype), q_t, c["dk"], self.precision, hint="dk")
                    return new

                c = hb.loop(lo, hi, block_n, c, step, iv_name="start_m")
            return c

        if group == 1:
            carried = head(kb, None, carried)
        else:
            carried = kb.loop(0, group, 1, carried, lambda hb, hg, c: head(hb, hg, c), iv_name="hg")
        k_name_host = self.host_name(self.chains.k_arg)
        if self.need_dk:
            orig = self.tensor(p, self.chains.k_arg)
            orig_base = kb.add(self.base(kb, orig, b_off, hk_off), kb.mul(n_off, orig.strides[2]))

            def load(chans: SSAValue) -> SSAValue:
                return self.qk.load_tile(
                    kb, orig_base, rows_n, kv_ok, orig.strides[2], orig.strides[3], chans, True, "k0"
                )

            program = kb.add(kb.mul(pid_bh, kb.emit(tl.NumProgramsOp(0))), pid_n, hint="program")
            k_rope_pos = self.positions(kb, p, self.k.chain, offs_n, b_off, offs_n, kv_ok)
            dk = self.chain_grad(
                kb, p, self.k, kb.mul(carried["dk"], self.scale), load, k_rope_pos, kv_ok, rows_n, program, "dk"
            )
            dk_out = self.typed_tensor(p, "DK", "dk", self.kdtype)
            self.store_tile(
                kb, dk_out, self.base(kb, dk_out, b_off, hk_off), n_off, rows_n, kv_ok, self.d, kb.cast(dk, self.kdtype)
            )
        if self.need_dv:
            dv_out = self.typed_tensor(p, "DV", "dv", self.vdtype)
            self.store_tile(
                kb,
                dv_out,
                self.base(kb, dv_out, b_off, hk_off),
                n_off,
                rows_n,
                kv_ok,
                self.dv,
                kb.cast(carried["dv"], self.vdtype),
            )
        p.block.add_op(tl.ReturnOp())
        grid = [f"_cdiv({k_name_host}.shape[2], {bkey})", f"{k_name_host}.shape[0] * {self.hkv}"]
        return KernelCall(self.kernel("attn_bwd_dkdv", p), p, grid, self.num_warps, self.num_stages)

    def dq_kernel(self) -> KernelCall:
        """`attn_bwd_dq`: dQ of one Q block, over the KV blocks it attends to."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        bm, bn = self.block_m, self.block_n
        qs, ks, v, do, lse_ptr, delta_ptr, nq, nk, block_m, block_n = self.loop_params(p)
        q_name = self.host_name(self.chains.q_arg)
        ids = self.q_program(kb, block_m, nq, nk)
        pid_bh, num_q_blocks, pid_m, b, h = ids.pid_bh, ids.num_q_blocks, ids.pid_m, ids.b, ids.h
        b_off, h_off, hk_off, m_start, m_off = ids.b_off, ids.h_off, ids.hk_off, ids.m_start, ids.m_off
        rows_m, offs_m, row_ok, shift, q_pos = ids.rows_m, ids.offs_m, ids.row_ok, ids.shift, ids.q_pos
        q_t = self.tile(kb, qs, self.base(kb, qs, b_off, h_off), m_off, rows_m, row_ok, self.d, "q")
        do_t = self.tile(kb, do, self.base(kb, do, b_off, h_off), m_off, rows_m, row_ok, self.dv, "do")
        row_base = kb.add(kb.mul(kb.cast(pid_bh, i64), nq), m_off, hint="row_base")
        lse = self.row_stat(kb, lse_ptr, row_base, rows_m, row_ok, POS_INF, "lse")
        lse2 = kb.row(kb.mul(kb.where(kb.cmp("==", lse, NEG_INF), POS_INF, lse), LOG2E, hint="lse2"))
        delta = kb.row(self.row_stat(kb, delta_ptr, row_base, rows_m, row_ok, 0.0, "delta"))
        k_base, v_base = self.base(kb, ks, b_off, hk_off), self.base(kb, v, b_off, hk_off)
        q_idx = kb.row(q_pos)
        docs = {a: kb.row(t) for a, t in self.doc_ids(kb, p, b_off, q_pos, row_ok).items()}
        q_lo = kb.add(m_start, shift, hint="q_lo")
        q_hi = kb.minimum(kb.add(q_lo, bm - 1), kb.sub(nk, 1), hint="q_hi")
        carried = {"dq": kb.full([block_m, self.dpad], 0.0, f32, hint="dq")}
        for lo, hi, masked in kv_segments(kb, self.kv_bounds, q_lo, q_hi, nk, bn):
            if lo is hi:
                continue

            def step(ib: KernelBuilder, start_n: SSAValue, c: dict[str, SSAValue], masked=masked):
                rows = ib.arange(block_n, hint="rows_n")
                offs_n = ib.add(start_n, rows, hint="offs_n")
                kv_ok = ib.cmp("<", offs_n, nk, hint="kv_ok") if masked else None
                n_off = ib.cast(start_n, i64, hint="n_off")
                k_t = self.tile(ib, ks, k_base, n_off, rows, kv_ok, self.d, "k")
                v_t = self.tile(ib, v, v_base, n_off, rows, kv_ok, self.dv, "v")
                s = ib.mul(ib.dot(q_t, ib.emit(tl.TransOp(k_t)), None, self.precision), self.score_scale, hint="s")
                if kv_ok is not None:
                    kv_ok_col = ib.col(kv_ok)
                    valid = ib.and_(ib.row(row_ok), kv_ok_col)
                else:
                    kv_ok_col = valid = ib.row(row_ok)
                ctx = ScoreCtx(b, h, b_off, q_idx, ib.col(offs_n), kv_ok_col, valid, docs, self.fast_tanh)
                env: dict[SSAValue, SSAValue] = {}
                s = self.score_ops(ib, p, s, ctx, masked, env)
                if kv_ok is not None:
                    s = ib.where(kv_ok_col, s, NEG_INF, hint="s_valid")
                pr = ib.unary(tl.Exp2Op, ib.sub(self.base2(ib, s), lse2), hint="p")
                dropped = self.dropped(ib, s) if masked else None
                pr = ib.where(dropped, 0.0, pr, hint="p_kept") if dropped is not None else pr
                dp = ib.dot(do_t, ib.emit(tl.TransOp(v_t)), None, self.precision, hint="dp")
                ds = self.score_grad(ib, p, pr, dp, delta, env, ctx, dropped)
                return {"dq": ib.dot(ib.cast(ds, self.kdtype), k_t, c["dq"], self.precision, hint="dq")}

            carried = kb.loop(lo, hi, block_n, carried, step)
        orig = self.tensor(p, self.chains.q_arg)
        orig_base = kb.add(self.base(kb, orig, b_off, h_off), kb.mul(m_off, orig.strides[2]))

        def load(chans: SSAValue) -> SSAValue:
            return self.qk.load_tile(kb, orig_base, rows_m, row_ok, orig.strides[2], orig.strides[3], chans, True, "q0")

        program = kb.add(kb.mul(pid_bh, num_q_blocks), pid_m, hint="program")
        q_rope_pos = self.positions(kb, p, self.q.chain, q_pos, b_off, offs_m, row_ok)
        dq = self.chain_grad(
            kb, p, self.q, kb.mul(carried["dq"], self.scale), load, q_rope_pos, row_ok, rows_m, program, "dq"
        )
        dq_out = self.typed_tensor(p, "DQ", "dq", self.dtype)
        self.store_tile(
            kb, dq_out, self.base(kb, dq_out, b_off, h_off), m_off, rows_m, row_ok, self.d, kb.cast(dq, self.dtype)
        )
        p.block.add_op(tl.ReturnOp())
        grid = [f"{q_name}.shape[0] * {self.hq}", f"_cdiv({q_name}.shape[2], {bm})"]
        return KernelCall(self.kernel("attn_bwd_dq", p), p, grid, self.num_warps, self.num_stages)

    # ------------------------------------------------------------------ the launcher
    def kernels(self) -> list[KernelCall]:
        calls = [self.pre_kernel()]
        if not (self.need_dk or self.need_dv or self.need_dq):
            return calls  # only a sink's gradient: delta and the sink's shares
        for side, which in ((self.q, "q"), (self.k, "k")):
            if side.pre:
                calls.append(self.rotate_kernel(which))
        if self.need_dk or self.need_dv:
            calls.append(self.dkdv_kernel())
        if self.need_dq:
            calls.append(self.dq_kernel())
        return calls

    def backward_launcher(self, calls: list[KernelCall]) -> tl.LauncherOp:
        """`launch(..., out, lse, dout)`: allocate delta, the pre-transformed copies and the
        gradients, run the kernels, sum the weights' partials, return the gradients in
        the order of `attn.wrt`."""
        q, k, v = (self.host_name(a) for a in (self.chains.q_arg, self.chains.k_arg, self.chains.v_arg))
        out = self.host_of(3)
        ops: list[Operation] = [
            tl.AllocOp("delta", [f"{out}.shape[0]", str(self.hq), f"{out}.shape[2]"], "torch.float32", f"{q}.device")
        ]

        rotated = {c.kernel.sym_name.data for c in calls}
        if "rotate_q" in rotated:
            ops.append(self.alloc_like("q_rot", q, self.hq, self.d, self.dtype))
        if "rotate_k" in rotated:
            ops.append(self.alloc_like("k_rot", k, self.hkv, self.d, self.kdtype))
        if self.need_dq:
            ops.append(self.alloc_like("dq", q, self.hq, self.d, self.dtype))
        if self.need_dk:
            ops.append(self.alloc_like("dk", k, self.hkv, self.d, self.kdtype))
        if self.need_dv:
            ops.append(self.alloc_like("dv", v, self.hkv, self.dv, self.vdtype))
        ops += self.partial_buffers(calls, f"{q}.device")
        ops += self.rope_host_ops(f"{q}.device")
        for c in calls:
            ops.append(tl.CallOp(c.kernel.sym_name.data, c.grid, c.params.host, c.num_warps, c.num_stages))
        ops += self.gradients_returned()
        return tl.LauncherOp("launch", self.names, ops)

    def partial_buffers(self, calls: list[KernelCall], device: str) -> list[Operation]:
        """The float32 buffers of the per-program shares of the sink's and the weights'
        gradients: [B, Hq, Q blocks of attn_bwd_pre], and [programs, head dim]."""
        out = self.host_of(3)
        ops: list[Operation] = []
        sink_grad = self.plan.sink_grad
        if sink_grad is not None and self.plan.needs(sink_grad.dsink):
            shape = [f"{out}.shape[0]", str(self.hq), f"_cdiv({out}.shape[2], 64)"]
            ops.append(tl.AllocOp("dsink_part", shape, "torch.float32", device))
        for part in self.partials:
            call = next(c for c in calls if part in c.params.host)
            programs = " * ".join(f"({g})" for g in call.grid)
            ops.append(tl.AllocOp(part, [programs, str(self.dpad)], "torch.float32", device))
        return ops

    def gradients_returned(self) -> list[Operation]:
        """Sum the partials of the sink's and the weights' gradients; return the gradients
        in the order of `attn.wrt`."""
        ops: list[Operation] = []
        returned: list[str] = []
        for index, value in zip(self.plan.wrt, self.plan.returned, strict=True):
            owner = value.owner
            if isinstance(owner, attn.SinkGradOp):
                ops.append(tl.HostSumOp(f"grad_{index}", "dsink_part", [0, 2], self._torch_dtype(value)))
                returned.append(f"grad_{index}")
            elif isinstance(owner, attn.NormWeightGradOp):
                ops.append(tl.HostSumOp(f"grad_{index}", f"grad_{index}_part", [0], self._torch_dtype(value)))
                returned.append(f"grad_{index}[: {self.d}]" if self.dpad != self.d else f"grad_{index}")
            else:
                returned.append({self.chains.q_arg.index: "dq", self.chains.k_arg.index: "dk"}.get(index, "dv"))
        ops.append(tl.HostReturnOp([f"({', '.join(returned)},)"] if len(returned) == 1 else returned))
        return ops

    @staticmethod
    def _torch_dtype(value: SSAValue) -> str:
        t = value.type
        assert isinstance(t, TensorType)
        return dtype_name(t.get_element_type(), "torch")
