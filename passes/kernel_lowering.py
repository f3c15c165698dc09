"""What every kernel path of convert-attn-to-tl shares on the device side: a variant's
kernel parameters, its score ops on a block of scores and the program's Q block
(`KernelLowering`, the base of `forward_to_tl.ForwardLowering`, `gluon_to_tl.GluonLowering`
and `backward_to_tl.BackwardLowering`); the pre-rotation kernels are `prerotate_to_tl`'s.

Addresses: a tensor may hold more than 2^31 elements (a KV cache of B=5, H=32, N=128k,
D=128), so every offset that grows with the tensor is computed in int64: the batch and
head offsets and the row offset of a tile's first row, added once to a scalar base
pointer, and the indices of extra tensors. The offsets within a tile (rows of a block,
channels) stay int32, as they are bounded by the block size times a stride; so do the
RoPE tables' (positions, or tokens of a positions tensor, x rotary_dim / 2: below 2^31 up to
2^24 of them).

Q's and K's transforms (RoPE, QK-norm, scale) are built by `qk_transforms_to_tl`, custom
mask/bias/score_mod regions by `region_to_tl`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, TensorType, f32, i32, i64
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.dialects.attn import LOG2E, Placement, PlacementAttr
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.kernel_path import uses_approx_tanh
from attnfuse.passes.kv_segments import kv_bounds
from attnfuse.passes.launcher_to_tl import KernelCall, LoweredFunction, call_op, kernel_op
from attnfuse.passes.qk_transforms_to_tl import CallTable, QKTransforms, rope_layout
from attnfuse.passes.region_to_tl import RegionEnv, lower_region
from attnfuse.passes.tl_builder import KernelBuilder, Params, TensorParam, pow2

LN2 = 0.6931471805599453
NEG_INF = float("-inf")
POS_INF = float("inf")
TABLE_BLOCK = 32
"""Rows of a per-call RoPE table (`rope_at_*_tables`) per program."""


@dataclass
class ScoreCtx:
    """What score ops and masks read in one KV step, as tiles over the block's
    (query, key) pairs."""

    b: SSAValue
    h: SSAValue
    b_off: SSAValue
    """b as int64, to multiply a batch stride."""
    q_idx: SSAValue
    """Query positions, [BLOCK_M, 1]."""
    kv_idx: SSAValue
    """Key positions, [1, BLOCK_N]."""
    kv_ok: SSAValue | None
    """Keys in range (in a full block: the rows in range); None: all are."""
    valid: SSAValue | None
    """Pairs whose query and key are both in range; None: all are."""
    doc_q: dict[SSAValue, SSAValue]
    """The queries' ids of each document mask, by its ids argument, [BLOCK_M, 1]."""
    fast_tanh: bool = False
    """tanh (softcap, regions) by the approximate instruction `tl.fast_tanh` (kernel-path's
    `tanh` choice, `uses_approx_tanh`; never in an interpreted kernel)."""


@dataclass
class QProgram:
    """A program's Q block, batch and heads (`Lowering.q_program`)."""

    pid_bh: SSAValue
    num_q_blocks: SSAValue
    pid_m: SSAValue
    b: SSAValue
    h: SSAValue
    b_off: SSAValue
    h_off: SSAValue
    hk_off: SSAValue
    """b, h and the kv head as int64 (they multiply strides)."""
    m_start: SSAValue
    m_off: SSAValue
    rows_m: SSAValue
    offs_m: SSAValue
    row_ok: SSAValue
    shift: SSAValue
    """Nk - Nq: the position of the first query."""
    q_pos: SSAValue
    k_row0: SSAValue | None = None
    """The row of K (and V) holding the sequence's first key, int64; None: row 0."""
    lse_row0: SSAValue | None = None
    """The lse offset of the Q block's first row; None: batch x head x Nq + its row."""


@dataclass
class KvProgram:
    """A dK/dV program's KV block, batch and KV head (`BackwardLowering.kv_program`)."""

    pid_n: SSAValue
    pid_bh: SSAValue
    b: SSAValue
    hk: SSAValue
    b_off: SSAValue
    hk_off: SSAValue
    n_start: SSAValue
    """The block's first key position."""
    n_off: SSAValue
    """The row of K and V holding that key, int64."""
    rows_n: SSAValue
    offs_n: SSAValue
    """Key positions of the block, [BLOCK_M]."""
    kv_ok: SSAValue
    nq: SSAValue
    nk: SSAValue
    q_row0: SSAValue | None = None
    """The row of Q holding the sequence's first query, int64; None: row 0."""
    lse_heads: SSAValue | None = None
    """With `lse_row0`: the lse offset of head h's first query row is h x `lse_heads` + `lse_row0`
    (None: (batch x Hq + h) x Nq)."""
    lse_row0: SSAValue | None = None

    def lse_rows(self, kb: KernelBuilder, h_off: SSAValue, hq: int) -> SSAValue:
        """The lse (and delta) offset of query head `h_off`'s first query row."""
        if self.lse_heads is not None and self.lse_row0 is not None:
            return kb.add(kb.mul(h_off, self.lse_heads), self.lse_row0, hint="row_base")
        return kb.mul(kb.add(kb.mul(self.b_off, hq), h_off), self.nq, hint="row_base")

    def q_rows(self, kb: KernelBuilder, start_m: SSAValue) -> SSAValue:
        """The row of Q (dO) holding query position `start_m`, int64."""
        m_off = kb.cast(start_m, i64, hint="m_off")
        return m_off if self.q_row0 is None else kb.add(m_off, self.q_row0, hint="m_seq")


class KernelLowering:
    """The kernels of one variant: what every kernel path builds them from."""

    def __init__(self, chains: AttentionChains, arg_names: list[str]):
        self.chains = chains
        self.names = arg_names
        tiling = chains.func.attributes.get("attn.tiling")
        if not isinstance(tiling, DictionaryAttr):
            raise DiagnosticException(
                f"func @{chains.func.sym_name.data} has no attn.tiling: run the tiling pass before convert-attn-to-tl"
            )
        t = {k: a.value.data for k, a in tiling.data.items() if isinstance(a, IntegerAttr)}
        self.block_m, self.block_n = t["block_m"], t["block_n"]
        self.num_warps, self.num_stages = t["num_warps"], t["num_stages"]
        qs, ks, vs = chains.q_type.get_shape(), chains.k_type.get_shape(), chains.v_type.get_shape()
        self.hq, self.hkv, self.d, self.dv = qs[1], ks[1], qs[3], vs[3]
        self.dtype = chains.q_type.get_element_type()
        self.fast_tanh = uses_approx_tanh(chains.func, gluon=False)
        """tanh by the approximate instruction in the generic kernels (kernel-path's choice)."""
        self.kdtype = chains.k_type.get_element_type()
        self.vdtype = chains.v_type.get_element_type()
        self.dpad = pow2(self.d)
        self.qk = QKTransforms(self.d, self.tensor)
        for chain in (chains.q_chain, chains.k_chain):
            rope_layout(chain)  # raises unless the chain has at most one attn.rope
        self.k_placement: Placement | None = None
        """Where K's transforms run (rope-fusion's placement; without it, in the KV loop)."""
        for op in chains.k_chain:
            placement = op.attributes.get("placement")
            self.k_placement = placement.data if isinstance(placement, PlacementAttr) else Placement.KV_LOOP
        score_scale = chains.qk.attributes.get("score_scale")
        self.score_scale = score_scale.value.data if isinstance(score_scale, FloatAttr) else chains.qk.effective_scale
        self.log2e_folded = chains.qk.log2e_folded
        self.kv_bounds = kv_bounds(chains)
        self.precision = "ieee" if self.dtype == f32 else None
        self.table_calls: list[KernelCall] = []
        """The kernels of the per-call RoPE tables, once `rope_host_ops` has built them."""

    # ------------------------------------------------------------------ parameters
    def host_name(self, value: SSAValue) -> str:
        """The launcher's name for a function argument."""
        assert isinstance(value, BlockArgument)
        return self.names[value.index]

    def tensor(
        self,
        p: Params,
        value: SSAValue,
        key: str | None = None,
        host: str | None = None,
        sizes: bool = False,
        element: Attribute | None = None,
    ) -> TensorParam:
        """Pointer and strides of a function argument (or of `host`, a tensor like it, whose
        elements may be `element`), and its sizes when `sizes` (to mask loads to its bounds)."""
        name = host or self.host_name(value)
        t = value.type
        assert isinstance(t, TensorType)
        key = key or name
        ptr = p.param(key, tl.PointerType(element or t.get_element_type()), name)
        rank = len(t.get_shape())
        strides = [p.param(f"stride_{key}_{d}", i32, f"{name}.stride({d})") for d in range(rank)]
        dims = [p.param(f"size_{key}_{d}", i32, f"{name}.shape[{d}]") for d in range(rank)] if sizes else []
        return TensorParam(ptr, strides, dims)

    def positions(
        self,
        kb: KernelBuilder,
        p: Params,
        chain: list[Operation],
        default: SSAValue,
        b_off: SSAValue,
        rows: SSAValue,
        ok: SSAValue | None,
    ) -> SSAValue:
        """What RoPE reads its cos and sin at for the rows `rows` of a q or k tile: for a rope at
        explicit positions, the rows' token indices into its per-call tables (b * N + row for
        [B, N] positions); else `default`, the rows' positions (the row convention)."""
        rope = next((op for op in chain if isinstance(op, attn.RopeOp)), None)
        if rope is None or rope.positions is None:
            return default
        tokens = self.sequence_tokens(rope.positions)
        if tokens is None:
            return rows
        n = p.param(f"{self.host_name(rope.positions)}_n", i32, tokens)
        return kb.add(kb.mul(kb.cast(b_off, i32), n), rows, hint="pos_tok")

    def sequence_tokens(self, positions: SSAValue) -> str | None:
        """The launcher's expression for the tokens per sequence of a [B, N] positions tensor
        (token b * N + n is row n of sequence b in its per-call tables); None for [N] positions,
        shared by the batch."""
        t = positions.type
        assert isinstance(t, TensorType)
        return f"{self.host_name(positions)}.shape[1]" if len(t.get_shape()) == 2 else None

    def rope_tables(self, op: attn.RopeOp) -> tuple[str, str, str]:
        """A RoPE's cos and sin tables as a Gluon kernel reads them: their host names and the
        launcher's expression for their rows per sequence ("0": tables by position)."""
        cos, sin = self.qk.trig_tables(Params(), op)
        rows = self.sequence_tokens(op.positions) if op.positions is not None else None
        return cos.name_hint or "", sin.name_hint or "", rows or "0"

    def rope_host_ops(self, device: str, length: str | None = None) -> list[Operation]:
        """The launcher's RoPE tables (positions 0..`length` - 1, by default max(Nq, Nk) - 1),
        inverse-frequency tensors and Hadamard matrices that the kernels read, and the launches
        of the per-call tables' kernels (`table_calls`, which `lowered` puts in the module)."""
        q, k = self.host_name(self.chains.q_arg), self.host_name(self.chains.k_arg)
        # Positions 0..Nk-1, and |Nk - Nq + i| < Nq for queries.
        length = length or f"max({q}.shape[2], {k}.shape[2])"
        ops: list[Operation] = []
        for key, (values, magnitude) in self.qk.tables.items():
            ops.append(tl.RopeTableOp(f"{key}_cos", f"{key}_sin", values, length, magnitude, device))
        self.table_calls = [self.call_table_kernel(key, t, length) for key, t in self.qk.call_tables.items()]
        ops += [tl.FreqTableOp(key, values, device) for key, values in self.qk.freqs.items()]
        ops += [tl.HadamardTableOp(key, self.d, seed, device) for key, seed in self.qk.hadamards.items()]
        for (key, t), call in zip(self.qk.call_tables.items(), self.table_calls, strict=True):
            shape = [self.table_rows(t, length), str(t.half)]
            ops += [tl.AllocOp(f"{key}_{f}", shape, "torch.float32", device) for f in ("cos", "sin")]
            ops.append(call_op(call))
        return ops

    def call_table_kernel(self, key: str, t: CallTable, length: str) -> KernelCall:
        """`<key>_tables`: a per-call RoPE table pair ([rows, half] float32 cos and sin, times
        the magnitude) at the tokens' positions, or at 0..`length` - 1 without a positions
        tensor."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        cos_ptr = p.param(f"{key}_cos", tl.PointerType(f32), f"{key}_cos")
        sin_ptr = p.param(f"{key}_sin", tl.PointerType(f32), f"{key}_sin")
        rows = p.param("ROWS", i32, self.table_rows(t, length))
        block = p.param("BLOCK", i32, str(TABLE_BLOCK), constexpr=True)
        tok = kb.add(kb.mul(kb.emit(tl.ProgramIdOp(0), "pid"), block), kb.arange(block), hint="tok")
        ok = kb.cmp("<", tok, rows, hint="tok_ok")
        pos = tok
        if t.positions is not None:
            name = self.host_name(t.positions)
            pt = self.tensor(p, t.positions)
            tokens = self.sequence_tokens(t.positions)
            if tokens is not None:
                n = p.param(f"{name}_n", i32, tokens)
                b, r = kb.cast(kb.floordiv(tok, n), i64), kb.cast(kb.rem(tok, n), i64)
                off = kb.add(kb.mul(b, pt.strides[0]), kb.mul(r, pt.strides[1]))
            else:
                off = kb.mul(kb.cast(tok, i64), pt.strides[0])
            pos = kb.load(kb.add(pt.ptr, off), ok, 0, hint="pos")
        if t.inv_freq is not None:
            ft = self.tensor(p, t.inv_freq)
            freq_ptr, freq_stride = ft.ptr, ft.strides[0]
        else:
            freq_ptr, freq_stride = self.qk.freq_table(p, t.values), 1
        pair = kb.arange(pow2(t.half), hint="pair")
        pair_ok = kb.cmp("<", pair, t.half, hint="pair_ok")
        freq = kb.load(kb.add(freq_ptr, kb.mul(pair, freq_stride)), pair_ok, 0.0, hint="inv_freq")
        angle = kb.mul(kb.row(kb.cast(pos, f32)), kb.col(kb.cast(freq, f32)), hint="angle")
        cos, sin = kb.unary(tl.CosOp, angle, hint="cos"), kb.unary(tl.SinOp, angle, hint="sin")
        if t.magnitude != 1.0:
            cos, sin = kb.mul(cos, t.magnitude), kb.mul(sin, t.magnitude)
        idx = kb.add(kb.mul(kb.row(tok), t.half), kb.col(pair), hint="idx")
        mask = kb.and_(kb.row(ok), kb.col(pair_ok))
        kb.store(kb.add(cos_ptr, idx), cos, mask)
        kb.store(kb.add(sin_ptr, idx), sin, mask)
        p.block.add_op(tl.ReturnOp())
        grid = [f"_cdiv({self.table_rows(t, length)}, {TABLE_BLOCK})"]
        return KernelCall(self.kernel(f"{key}_tables", p), p, grid, 4, 1)

    def table_rows(self, t: CallTable, length: str) -> str:
        """The launcher's expression for a per-call table's rows: the positions' tokens, or `length`."""
        return f"{self.host_name(t.positions)}.numel()" if t.positions is not None else length

    def lowered(
        self, kernels: list[tl.KernelOp], launcher: tl.LauncherOp, functions: list[tl.DeviceFnOp] | None = None
    ) -> LoweredFunction:
        """The lowered function: the per-call tables' kernels (which `launcher`, built first,
        launches), then `kernels` and `functions`."""
        tables = [c.kernel for c in self.table_calls]
        return LoweredFunction([*tables, *kernels], launcher, functions or [])

    # ------------------------------------------------------------------ score ops
    def region(
        self,
        kb: KernelBuilder,
        p: Params,
        op: attn.MaskOp | attn.BiasOp | attn.ScoreModOp,
        ctx: ScoreCtx,
        score: SSAValue | None,
    ) -> SSAValue:
        """The value a custom region yields for every pair of the block."""
        head = [] if score is None else [score]
        index_args = [*head, ctx.b, ctx.h, ctx.q_idx, ctx.kv_idx]
        extra_args = op.body.blocks[0].args[len(index_args) :]
        extras: dict[SSAValue, TensorParam] = {
            a: self.tensor(p, e, sizes=True) for a, e in zip(extra_args, op.extras, strict=True)
        }
        return lower_region(kb, op, index_args, RegionEnv(extras, ctx.valid, ctx.fast_tanh))

    @property
    def to_base2(self) -> float:
        """The factor from the score ops' scores to base-2 logits: `score_scale` itself when every
        score op is linear (the product goes through them unscaled), else log2 e."""
        return self.score_scale if self.log2e_folded else LOG2E

    def scores(self, kb: KernelBuilder, product: SSAValue) -> SSAValue:
        """The scores the score ops take, from Q·Kᵀ's fp32 product: the product itself when
        every score op is linear (its scale then joins `to_base2`), else scaled to natural
        units (a softcap or score_mod needs them). Never a scaled 16-bit q or k: its rounding
        costs accuracy with large logits and would differ between forward and backward."""
        return product if self.log2e_folded else kb.mul(product, self.score_scale, hint="s")

    def score_ops(
        self,
        kb: KernelBuilder,
        p: Params,
        s: SSAValue,
        ctx: ScoreCtx,
        masked: bool,
        env: dict[SSAValue, SSAValue] | None = None,
    ) -> SSAValue:
        """Apply the score chain to `s`; masks only where `masked` (partial blocks). `env`,
        if given, receives each score op's result (before masking) by its IR value.

        Masks are applied after the last score op, whatever their place in the chain: a
        masked score stays masked (a softcap or score_mod after the mask must not turn
        its -inf into a finite value)."""
        keep: SSAValue | None = None
        env = {} if env is None else env
        env[self.chains.qk.scores] = s
        for op in self.chains.score_ops:
            if isinstance(op, attn.ScaleOp):
                s = kb.mul(s, op.value.value.data)
            elif isinstance(op, attn.SoftcapOp):
                s = self.softcap(kb, s, op.cap.value.data, ctx.fast_tanh)
            elif isinstance(op, attn.BiasOp):
                if op.kind.data == "alibi":
                    slopes = self.tensor(p, op.extras[0])
                    slope_ptr = kb.add(slopes.ptr, kb.mul(kb.cast(ctx.h, i64), slopes.strides[0]))
                    slope = kb.cast(kb.load(slope_ptr, hint="slope"), f32)
                    rel = kb.cast(kb.sub(ctx.kv_idx, ctx.q_idx), f32)
                    s = kb.add(s, kb.mul(rel, slope), hint="s_biased")
                else:
                    s = kb.add(s, self.region(kb, p, op, ctx, None), hint="s_biased")
            elif isinstance(op, attn.ScoreModOp):
                s = self.region(kb, p, op, ctx, s)
            elif isinstance(op, attn.MaskOp):
                if masked:
                    pred = self.predicate(kb, p, op, ctx)
                    keep = pred if keep is None else kb.and_(keep, pred, hint="keep")
            else:
                raise DiagnosticException(f"'{op.name}' cannot modify scores")
            env[op.results[0]] = s
        if keep is not None:
            s = kb.where(keep, s, NEG_INF, hint="s_masked")
        return s

    def online_softmax(
        self, kb: KernelBuilder, s: SSAValue, c: dict[str, SSAValue]
    ) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue]:
        """One block's online-softmax update in base 2 of the carried `m_i`, `l_i`, `acc`:
        (m_new, l_new, p, acc rescaled), P·V still to be added to the last."""
        # Base 2 by one factor (positive: the max commutes with it), which joins exp2's
        # argument as one fused multiply-add per score.
        m_new = kb.maximum(c["m_i"], kb.mul(kb.reduce("max", s, 1), self.to_base2), hint="m_new")
        m_safe = kb.where(kb.cmp("==", m_new, NEG_INF), 0.0, m_new, hint="m_safe")
        pr = kb.unary(tl.Exp2Op, kb.sub(kb.mul(s, self.to_base2), kb.row(m_safe)), hint="p")
        alpha = kb.unary(tl.Exp2Op, kb.sub(c["m_i"], m_safe), hint="alpha")
        l_new = kb.add(kb.mul(c["l_i"], alpha), kb.reduce("sum", pr, 1), hint="l_new")
        acc_s = kb.mul(c["acc"], kb.row(alpha), hint="acc_scaled")
        return m_new, l_new, pr, acc_s

    @staticmethod
    def softcap(kb: KernelBuilder, s: SSAValue, cap: float, fast_tanh: bool) -> SSAValue:
        """cap·tanh(s / cap): by the approximate tanh instruction, or as cap·(2·sigmoid(2s/cap) - 1)."""
        if fast_tanh:
            return kb.mul(kb.unary(tl.FastTanhOp, kb.mul(s, 1.0 / cap)), cap, hint="s_capped")
        t = kb.unary(tl.SigmoidOp, kb.mul(s, 2.0 / cap))
        return kb.mul(kb.sub(kb.mul(t, 2.0), 1.0), cap, hint="s_capped")

    def predicate(self, kb: KernelBuilder, p: Params, op: attn.MaskOp, ctx: ScoreCtx) -> SSAValue:
        """Where the mask keeps a score (attn.MaskOp's named predicates, or its region)."""
        q, kv = ctx.q_idx, ctx.kv_idx
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
            base = kb.add(ids.ptr, kb.mul(ctx.b_off, ids.strides[0]))
            doc_k = kb.load(kb.add(base, kb.mul(kb.cast(kv, i64), ids.strides[1])), ctx.kv_ok, -2, hint="doc_k")
            return kb.cmp("==", ctx.doc_q[op.extras[0]], doc_k, hint="same_doc")
        return self.region(kb, p, op, ctx, None)

    def query_doc_ids(
        self, kb: KernelBuilder, p: Params, b_off: SSAValue, q_pos: SSAValue, ok: SSAValue | None
    ) -> dict[SSAValue, SSAValue]:
        """The document id of each query at `q_pos` (-1 where not `ok`), per document mask,
        by its ids argument."""
        doc_q: dict[SSAValue, SSAValue] = {}
        for mask in self.chains.masks:
            if mask.kind.data == "document":
                ids = self.tensor(p, mask.extras[0])
                base = kb.add(ids.ptr, kb.mul(b_off, ids.strides[0]))
                ptr = kb.add(base, kb.mul(kb.cast(q_pos, i64), ids.strides[1]))
                doc_q[mask.extras[0]] = kb.load(ptr, ok, -1, hint="doc_q")
        return doc_q

    def hook_ctx(
        self,
        kb: KernelBuilder,
        p: Params,
        q_idx: SSAValue,
        kv_idx: SSAValue,
        off_hz: SSAValue,
        masked: bool,
        like: Params | None,
    ) -> ScoreCtx:
        """The score context of a function an sm90 Gluon kernel calls with positions q_idx and
        kv_idx of batch*head `off_hz` (every pair in range), its own parameters declared first.
        With `like` (the masked function of the pair), its extra parameters are declared next,
        in order, so both functions take the same arguments. The queries' document ids when
        `masked`; tanh by the approximate instruction where kernel-path chose it for the Gluon
        kernels."""
        if like is not None:
            first = len(p.host)
            for (key, arg), host in zip(list(like.by_key.items())[first:], like.host[first:], strict=True):
                p.param(key, arg.type, host)
        b = kb.floordiv(off_hz, self.hq, hint="b")
        h = kb.rem(off_hz, self.hq, hint="h")
        b_off = kb.cast(b, i64, hint="b_off")
        doc_q = self.query_doc_ids(kb, p, b_off, q_idx, None) if masked else {}
        fast_tanh = uses_approx_tanh(self.chains.func, gluon=True)
        return ScoreCtx(b, h, b_off, q_idx, kv_idx, None, None, doc_q, fast_tanh)

    # ------------------------------------------------------------------ the program's Q block
    def length_params(self, p: Params) -> tuple[SSAValue, ...]:
        """The kernel's parameters its lengths come from: Nq and Nk (a varlen kernel: its
        sequences' bounds)."""
        chains = self.chains
        nq = p.param("NQ", i32, f"{self.host_name(chains.q_arg)}.shape[2]")
        return nq, p.param("NK", i32, f"{self.host_name(chains.k_arg)}.shape[2]")

    def program(
        self, kb: KernelBuilder, lengths: tuple[SSAValue, ...], block_m: SSAValue
    ) -> tuple[SSAValue, SSAValue, QProgram]:
        """(Nq, Nk, the program's Q block)."""
        nq, nk = lengths
        return nq, nk, self.q_program(kb, block_m, nq, nk)

    def q_program(self, kb: KernelBuilder, block_m: SSAValue, nq: SSAValue, nk: SSAValue) -> QProgram:
        """The program's Q block, batch and heads, on a grid (batch x heads, Q blocks)."""
        # Q blocks walked from the last: with a causal mask the last Q blocks do the most
        # work, and starting them first shortens the tail of the launch (11-12% at N=4096 on
        # the H200, benchmarks/NOTES.md).
        pid_bh = kb.emit(tl.ProgramIdOp(0), "pid_bh")
        num_q_blocks = kb.emit(tl.NumProgramsOp(1), "num_q_blocks")
        pid_m = kb.sub(kb.sub(num_q_blocks, 1), kb.emit(tl.ProgramIdOp(1), "q_block"), hint="pid_m")
        b = kb.floordiv(pid_bh, self.hq, hint="b")
        h = kb.rem(pid_bh, self.hq, hint="h")
        hk = kb.floordiv(h, self.hq // self.hkv, hint="h_kv") if self.hq != self.hkv else h
        # Offsets that grow with a tensor's size in int64 (a KV cache may pass 2^31 elements).
        b_off, h_off = kb.cast(b, i64, hint="b_off"), kb.cast(h, i64, hint="h_off")
        hk_off = kb.cast(hk, i64, hint="hk_off") if hk is not h else h_off
        m_start = kb.mul(pid_m, block_m, hint="m_start")
        m_off = kb.cast(m_start, i64, hint="m_off")
        rows_m = kb.arange(block_m, hint="rows_m")
        offs_m = kb.add(m_start, rows_m, hint="offs_m")
        row_ok = kb.cmp("<", offs_m, nq, hint="row_ok")
        shift = kb.sub(nk, nq, hint="q_shift")
        q_pos = kb.add(offs_m, shift, hint="q_pos")
        return QProgram(
            pid_bh,
            num_q_blocks,
            pid_m,
            b,
            h,
            b_off,
            h_off,
            hk_off,
            m_start,
            m_off,
            rows_m,
            offs_m,
            row_ok,
            shift,
            q_pos,
        )

    # ------------------------------------------------------------------ positions of pre-rotated rows
    def row_positions(self, kb: KernelBuilder, p: Params, which: str, offs_n: SSAValue, n: SSAValue) -> SSAValue:
        """The positions of rows `offs_n` of q or k (`which`) in a pre-rotation kernel: k's row n
        is position n; queries are the last NQ of the NK positions."""
        if which != "q":
            return offs_n
        nk = p.param("NK", i32, f"{self.host_name(self.chains.k_arg)}.shape[2]")
        return kb.add(offs_n, kb.sub(nk, n), hint="q_pos")

    # ------------------------------------------------------------------ kernels and launcher
    def kernel(self, name: str, p: Params) -> tl.KernelOp:
        """A `tl.kernel` holding the built body (with the arguments it created)."""
        return kernel_op(name, p)
