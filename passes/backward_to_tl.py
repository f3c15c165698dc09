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

This module holds `BackwardLowering` (what the kernels share: the plan of derivative ops,
tile loads and stores, the score gradient) and the launcher; each kernel has its module:
`backward_pre_to_tl`, `backward_dkdv_to_tl`, `backward_dq_to_tl`, and their epilogues (the
chains' derivatives) `backward_epilogues_to_tl`. The pre-rotation kernels are
`kernel_lowering`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, TensorType, f32, i32, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.dialects.attn import LOG2E
from attnfuse.dialects.tl import dtype_name
from attnfuse.passes import backward_pre_to_tl
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.backward_dkdv_to_tl import dkdv_kernel
from attnfuse.passes.backward_dq_to_tl import dq_kernel
from attnfuse.passes.backward_pre_to_tl import pre_kernel
from attnfuse.passes.kernel_lowering import NEG_INF, KernelLowering, KvProgram, ScoreCtx
from attnfuse.passes.launcher_to_tl import KernelCall, LoweredFunction, alloc_like, call_op
from attnfuse.passes.prerotate_to_tl import rotate_kernel
from attnfuse.passes.tl_builder import KernelBuilder, Params, TensorParam, pow2

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
    dtype: Attribute
    pre: bool
    """Read from the pre-transformed copy (`q_rot` / `k_rot`)."""
    signed_pos: bool


class BackwardLowering(KernelLowering):
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

    def probs(self, kb: KernelBuilder, s: SSAValue, lse2: SSAValue, masked: bool) -> tuple[SSAValue, SSAValue | None]:
        """P recomputed from the saved log-sum-exp (`lse2`, base 2), and in a partial block
        where its masks removed the score (-inf; None in a full block): P is exactly 0 there,
        not exp2(-inf - lse) = NaN in a row whose lse a NaN query made NaN."""
        pr = kb.unary(tl.Exp2Op, kb.sub(self.base2(kb, s), lse2), hint="p")
        if not masked:
            return pr, None
        dropped = kb.cmp("==", s, NEG_INF, hint="dropped")
        return kb.where(dropped, 0.0, pr, hint="p_kept"), dropped

    def base2(self, kb: KernelBuilder, s: SSAValue) -> SSAValue:
        """The scores in base 2 (`to_base2`: the whole scale when the score ops are linear)."""
        return kb.mul(s, self.to_base2, hint="s2")

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

    # ------------------------------------------------------------------ the kernels' parameters
    def loop_params(self, p: Params) -> tuple:
        """The parameters the dK/dV and dQ kernels share: the q and k tiles' sources, v, dout,
        lse, delta, NQ, NK, BLOCK_M and BLOCK_N."""
        qs, ks, v = self.source(p, self.q), self.source(p, self.k), self.tensor(p, self.chains.v_arg)
        do = self.typed_tensor(p, "dout", self.host_of(1), self.dtype)
        lse_ptr = p.param("Lse", tl.PointerType(f32), self.host_of(2))
        delta_ptr = p.param("Delta", tl.PointerType(f32), "delta")
        lengths = self.length_params(p)
        block_m = p.param("BLOCK_M", i32, str(self.block_m), constexpr=True)
        block_n = p.param("BLOCK_N", i32, str(self.block_n), constexpr=True)
        return qs, ks, v, do, lse_ptr, delta_ptr, lengths, block_m, block_n

    def kv_program(self, kb: KernelBuilder, lengths: tuple[SSAValue, ...], block_m: SSAValue) -> KvProgram:
        """The dK/dV program's KV block, batch and KV head, on a grid (KV blocks, batch x KV heads)."""
        nq, nk = lengths
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
        return KvProgram(pid_n, pid_bh, b, hk, b_off, hk_off, n_start, n_off, rows_n, offs_n, kv_ok, nq, nk)

    def dkdv_grid(self) -> list[str]:
        """The dK/dV kernel's grid: (KV blocks, batch x KV heads)."""
        k = self.host_name(self.chains.k_arg)
        return [f"_cdiv({k}.shape[2], {self.block_m})", f"{k}.shape[0] * {self.hkv}"]

    def dq_grid(self) -> list[str]:
        """The dQ kernel's grid: (batch x heads, Q blocks)."""
        q = self.host_name(self.chains.q_arg)
        return [f"{q}.shape[0] * {self.hq}", f"_cdiv({q}.shape[2], {self.block_m})"]

    # ------------------------------------------------------------------ the launcher
    def lower(self) -> LoweredFunction:
        """The backward's kernels and their launcher."""
        calls = self.kernels()
        launcher = self.backward_launcher(calls)
        return self.lowered([c.kernel for c in calls], launcher)

    def kernels(self) -> list[KernelCall]:
        calls = [pre_kernel(self)]
        if not (self.need_dk or self.need_dv or self.need_dq):
            return calls  # only a sink's gradient: delta and the sink's shares
        for side, which in ((self.q, "q"), (self.k, "k")):
            if side.pre:
                calls.append(rotate_kernel(self, which))
        if self.need_dk or self.need_dv:
            calls.append(dkdv_kernel(self))
        if self.need_dq:
            calls.append(dq_kernel(self))
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
            ops.append(alloc_like("q_rot", q, self.hq, self.d, self.dtype))
        if "rotate_k" in rotated:
            ops.append(alloc_like("k_rot", k, self.hkv, self.d, self.kdtype))
        # The gradients laid out in their input's dimension order, as PyTorch's SDPA lays out its
        # own (the gradient of a transposed view, as transformers hands q, k and v over, is then a
        # view of a contiguous tensor for the layers before, not a copy): the kernels store them
        # with strides.
        if self.need_dq:
            ops.append(alloc_like("dq", q, self.hq, self.d, self.dtype, ordered=True))
        if self.need_dk:
            ops.append(alloc_like("dk", k, self.hkv, self.d, self.kdtype, ordered=True))
        if self.need_dv:
            ops.append(alloc_like("dv", v, self.hkv, self.dv, self.vdtype, ordered=True))
        ops += self.partial_buffers(calls, f"{q}.device")
        ops += self.rope_host_ops(f"{q}.device")
        for c in calls:
            ops.append(call_op(c))
        ops += self.gradients_returned()
        return tl.LauncherOp("launch", self.launcher_params(), ops)

    def launcher_params(self) -> list[str]:
        """The launcher's parameters: the function's arguments (q, k, v, extras, out, lse, dout)."""
        return list(self.names)

    def partial_buffers(self, calls: list[KernelCall], device: str) -> list[Operation]:
        """The float32 buffers of the per-program shares of the sink's and the weights'
        gradients: [B, Hq, Q blocks of attn_bwd_pre], and [programs, head dim]."""
        out = self.host_of(3)
        ops: list[Operation] = []
        sink_grad = self.plan.sink_grad
        if sink_grad is not None and self.plan.needs(sink_grad.dsink):
            shape = [f"{out}.shape[0]", str(self.hq), f"_cdiv({out}.shape[2], {backward_pre_to_tl.PRE.block})"]
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
