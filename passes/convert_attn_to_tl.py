"""convert-attn-to-tl: lower an annotated attention variant to Triton kernels and a host launcher.

The main kernel, `attn_fwd`, is FlashAttention-2's forward: one program per (Q block,
batch x head), in three parts.
- Prologue: load the Q tile once, apply Q's transforms (RoPE, QK-norm, scale) in fp32
  and cast to the input dtype.
- KV steps, over the KV blocks causal-split allows (skipped blocks are never visited,
  full blocks carry no mask code): load a K tile (transformed here when K's placement
  is `kv_loop`), take the scores and multiply them, in fp32, by rope-fusion's
  `score_scale` (attn.qk's scale and, when `log2e_folded`, the base-2 softmax's log2 e:
  never folded into the 16-bit Q tile, whose rounding would differ from the backward's
  and lose accuracy with large logits), apply the score ops and masks, update the online
  softmax (base 2) and the accumulator with V.
- Epilogue: count the sink logit, normalise (a fully masked row gives zeros), store the
  output and the per-row log-sum-exp (natural log) for a backward.

When K's placement is `prerotate`, a second kernel, `rotate_k`, writes K's transformed
copy once, before `attn_fwd` runs. The launcher allocates the outputs, builds the RoPE
cos/sin tables and launches the kernels.

Addresses: a tensor may hold more than 2^31 elements (a KV cache of B=5, H=32, N=128k,
D=128), so every offset that grows with the tensor is computed in int64: the batch and
head offsets and the row offset of a tile's first row, added once to a scalar base
pointer, and the indices of extra tensors. The offsets within a tile (rows of a block,
channels) stay int32, as they are bounded by the block size times a stride; so do the
RoPE tables' (positions x rotary_dim / 2, below 2^31 up to 2^24 positions).

The tl ops are built with `tl_builder`; Q's and K's transforms (RoPE, QK-norm, scale) by
`qk_transforms_to_tl`, custom mask/bias/score_mod regions by `region_to_tl`, and the KV
loop's segments by `kv_segments`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, ModuleOp, TensorType, f32, i32, i64
from xdsl.ir import Attribute, Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.dialects.attn import LOG2E, Placement, PlacementAttr
from attnfuse.dialects.tl import RESERVED_NAMES, dtype_name
from attnfuse.passes.analysis import AttentionChains, analyse, variant_funcs
from attnfuse.passes.kernel_path import GLUON, GLUON_BLOCK, gluon_rotates_q, kernel_path, uses_approx_tanh
from attnfuse.passes.kv_segments import kv_bounds, kv_segments
from attnfuse.passes.qk_transforms_to_tl import QKTransforms, rope_layout
from attnfuse.passes.region_to_tl import RegionEnv, lower_region
from attnfuse.passes.tl_builder import KernelBuilder, Params, TensorParam, pow2

HOST_NAMES = ("out", "lse", "k_rot", "q_rot", "dout", "delta", "dq", "dk", "dv", "dsink_part")
"""Names the launchers give their own tensors (a variant argument named so is renamed)."""

LN2 = 0.6931471805599453
NEG_INF = float("-inf")
POS_INF = float("inf")
NAN = float("nan")


@dataclass(frozen=True)
class PrerotateConfig:
    """Launch shape of the K pre-rotation kernel: a streaming copy of `block_n` rows of K
    per program, so a few warps and no software pipelining."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 1


PREROTATE = PrerotateConfig()


@dataclass
class KernelCall:
    """A built kernel and how the launcher runs it."""

    kernel: tl.KernelOp
    params: Params
    grid: list[str]
    """Host expressions for the grid's axes."""
    num_warps: int
    num_stages: int


# ----------------------------------------------------------------------------- lowering


@dataclass
class GluonFunctions:
    """A variant's score ops as the sm90 Gluon kernel takes them: device functions for its KV
    range and for the scores of unmasked and masked blocks, and their extra arguments."""

    range_fn: tl.DeviceFnOp
    score_full: tl.DeviceFnOp | None
    """None: the score ops are masks only (an unmasked block's scores stay as they are)."""
    score_masked: tl.DeviceFnOp
    natural: bool
    """The functions read the scaled scores (some score op is not a mask)."""
    args: list[str]
    """Host expressions for the score functions' arguments after (s, q_idx, kv_idx, off_hz)."""

    @property
    def ops(self) -> list[tl.DeviceFnOp]:
        fns = [self.range_fn, self.score_full, self.score_masked]
        return [f for i, f in enumerate(fns) if f is not None and f not in fns[:i]]


@dataclass
class GluonLaunch:
    """The sm90 Gluon kernel's share of a launcher: its pre-rotation kernel for Q (None when
    Q has no transforms or the kernel rotates Q itself), the shortest sequence it runs, the
    variant's score functions (None when the kernel's own causal-or-no mask is the variant's)
    and the cos/sin tables of the RoPE it applies to Q (host names; None: none), after q_norm."""

    rotate_q: KernelCall | None
    min_len: int
    functions: GluonFunctions | None
    q_rope: tuple[str, str] | None = None
    q_norm: tuple[str | None, float] | None = None
    """Q's RMSNorm the Gluon kernel applies (its weight's host name or None, eps); None: none."""


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


class Lowering:
    """Builds the kernels of one variant."""

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
        self.gluon_fast_tanh = uses_approx_tanh(chains.func, gluon=True)
        """The same in the Gluon kernel's score functions."""
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

    # ------------------------------------------------------------------ parameters
    def host_name(self, value: SSAValue) -> str:
        """The launcher's name for a function argument."""
        assert isinstance(value, BlockArgument)
        return self.names[value.index]

    def tensor(
        self, p: Params, value: SSAValue, key: str | None = None, host: str | None = None, sizes: bool = False
    ) -> TensorParam:
        """Pointer and strides of a function argument (or of `host`, a tensor like it), and
        its sizes when `sizes` (to mask loads to its bounds)."""
        name = host or self.host_name(value)
        t = value.type
        assert isinstance(t, TensorType)
        key = key or name
        ptr = p.param(key, tl.PointerType(t.get_element_type()), name)
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
        """The positions RoPE rotates the rows `rows` of a q or k tile at: its rope's
        `positions` operand, loaded (int32), or else `default` (the row convention)."""
        rope = next((op for op in chain if isinstance(op, attn.RopeOp)), None)
        if rope is None or rope.positions is None:
            return default
        t = self.tensor(p, rope.positions)
        base = kb.add(t.ptr, kb.mul(b_off, t.strides[0])) if len(t.strides) == 2 else t.ptr
        ptr = kb.add(base, kb.mul(kb.cast(rows, i64), t.strides[-1]))
        return kb.cast(kb.load(ptr, ok, 0, hint="pos"), i32)

    def rope_host_ops(self, device: str) -> list[Operation]:
        """The launcher's RoPE tables (positions 0..max(Nq, Nk) - 1) and inverse-frequency
        tensors (ropes at explicit positions) that the kernels read."""
        q, k = self.host_name(self.chains.q_arg), self.host_name(self.chains.k_arg)
        ops: list[Operation] = []
        for key, (values, magnitude) in self.qk.tables.items():
            # Positions 0..Nk-1, and |Nk - Nq + i| < Nq for queries.
            length = f"max({q}.shape[2], {k}.shape[2])"
            ops.append(tl.RopeTableOp(f"{key}_cos", f"{key}_sin", values, length, magnitude, device))
        ops += [tl.FreqTableOp(key, values, device) for key, values in self.qk.freqs.items()]
        return ops

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

    # ------------------------------------------------------------------ the sm90 Gluon kernel's functions
    def gluon_functions(self) -> GluonFunctions | None:
        """The variant's score ops as device functions for the sm90 Gluon kernel; None when
        they are a causal mask or nothing, which the kernel applies itself."""
        ops = self.chains.score_ops
        if all(isinstance(op, attn.MaskOp) and op.kind.data == "causal" and not op.extras for op in ops):
            return None
        natural = any(not isinstance(op, attn.MaskOp) for op in ops)
        masks = bool(self.chains.masks)
        masked, params = self.gluon_score_fn("gluon_score_masked" if masks else "gluon_score", True, None)
        full = None
        if natural:
            full = self.gluon_score_fn("gluon_score", False, params)[0] if masks else masked
        return GluonFunctions(self.gluon_range_fn(), full, masked, natural, params.host[4:])

    def gluon_q_transforms(self) -> tuple[tuple[str, str] | None, tuple[str | None, float] | None] | None:
        """Q's transforms as the Gluon kernel applies them itself (`kernel_path.gluon_rotates_q`):
        the launcher's cos and sin tables of its RoPE and its RMSNorm's (weight, eps), each None
        when absent; None when the kernel cannot (Q then goes through rotate_q)."""
        if not gluon_rotates_q(self.chains):
            return None
        rope, norm = None, None
        for op in self.chains.q_chain:
            if isinstance(op, attn.RopeOp):
                cos, sin = self.qk.rope_tables(Params(), op)
                rope = (cos.name_hint or "", sin.name_hint or "")
            elif isinstance(op, attn.NormOp):
                weight = self.host_name(op.weight) if op.weight is not None else None
                norm = (weight, op.eps.value.data)
        return rope, norm

    def gluon_range_fn(self) -> tl.DeviceFnOp:
        """`gluon_kv_range(q_lo, q_hi, NK)`: the keys some query of positions [q_lo, q_hi]
        keeps, [lo, hi), and those all of them keep, [full_lo, full_hi) (causal-split's
        bounds, as `kv_segments` gives the generic kernel's loop)."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        q_lo, q_hi, nk = (p.param(n, i32, "") for n in ("q_lo", "q_hi", "NK"))
        segments = kv_segments(kb, self.kv_bounds, q_lo, q_hi, nk, GLUON_BLOCK)
        lo, hi = segments[0][0], segments[-1][1]
        f_lo, f_hi = (segments[1][0], segments[1][1]) if len(segments) == 3 else (hi, hi)
        p.block.add_op(tl.ReturnOp(lo, f_lo, f_hi, hi))
        return self.device_fn("gluon_kv_range", p)

    def gluon_score_fn(self, name: str, masked: bool, like: Params | None) -> tuple[tl.DeviceFnOp, Params]:
        """`name(s, q_idx, kv_idx, off_hz, *extras)`: the score ops on a block of scores `s`
        (the masks too when `masked`), for query and key positions q_idx [M, 1] and kv_idx
        [1, N] of batch*head `off_hz`; every pair is in range. Its extra parameters are those
        of `like` (the masked function's), in order, when given."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        s = p.param("s", tl.TileType(f32), "")
        q_idx = p.param("q_idx", tl.TileType(i32), "")
        kv_idx = p.param("kv_idx", tl.TileType(i32), "")
        off_hz = p.param("off_hz", i32, "")
        if like is not None:
            for (key, arg), host in zip(list(like.by_key.items())[4:], like.host[4:], strict=True):
                p.param(key, arg.type, host)
        b = kb.floordiv(off_hz, self.hq, hint="b")
        h = kb.rem(off_hz, self.hq, hint="h")
        b_off = kb.cast(b, i64, hint="b_off")
        doc_q = self.query_doc_ids(kb, p, b_off, q_idx, None) if masked else {}
        ctx = ScoreCtx(b, h, b_off, q_idx, kv_idx, None, None, doc_q, self.gluon_fast_tanh)
        out = self.score_ops(kb, p, s, ctx, masked)
        if like is not None and len(p.host) != len(like.host):
            raise DiagnosticException(f"{name} reads a tensor the masked score function does not")
        p.block.add_op(tl.ReturnOp(out))
        return self.device_fn(name, p), p

    @staticmethod
    def device_fn(name: str, p: Params) -> tl.DeviceFnOp:
        _erase_dead(p.block)
        return tl.DeviceFnOp(name, p.block)

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
        q = self.host_name(self.chains.q_arg)
        grid = [f"{q}.shape[0] * {self.hq}", f"_cdiv({q}.shape[2], {self.block_m})"]
        return KernelCall(self.kernel("attn_fwd", p), p, grid, self.num_warps, self.num_stages)

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

    def prologue(self, kb: KernelBuilder, p: Params) -> QBlock:
        """The kernel's parameters, the program's Q block, batch and head, and the Q tile."""
        chains = self.chains
        q = self.tensor(p, chains.q_arg)
        pre = self.k_placement == Placement.PREROTATE
        k = self.tensor(p, chains.k_arg, key="k_rot" if pre else None, host="k_rot" if pre else None)
        v = self.tensor(p, chains.v_arg)
        out_ptr = p.param("Out", tl.PointerType(self.dtype), "out")
        out = TensorParam(out_ptr, [p.param(f"stride_o_{d}", i32, f"out.stride({d})") for d in range(4)])
        lse_ptr = p.param("Lse", tl.PointerType(f32), "lse")
        nq = p.param("NQ", i32, f"{self.host_name(chains.q_arg)}.shape[2]")
        nk = p.param("NK", i32, f"{self.host_name(chains.k_arg)}.shape[2]")
        block_m = p.param("BLOCK_M", i32, str(self.block_m), constexpr=True)
        block_n = p.param("BLOCK_N", i32, str(self.block_n), constexpr=True)

        ids = self.q_program(kb, block_m, nq, nk)
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
        # Q: load, transform, cast once (the scale goes on the fp32 scores).
        q_bh = kb.add(kb.add(q.ptr, kb.mul(b_off, q.strides[0])), kb.mul(h_off, q.strides[1]))
        q_base = kb.add(q_bh, kb.mul(m_off, q.strides[2]), hint="q_base")

        def load_q(chans: SSAValue, hint: str = "q") -> SSAValue:
            return self.qk.load_tile(kb, q_base, rows_m, row_ok, q.strides[2], q.strides[3], chans, True, hint)

        if chains.q_chain:
            q_x = self.qk.transformed(
                kb,
                p,
                chains.q_chain,
                load_q,
                self.positions(kb, p, chains.q_chain, q_pos, b_off, offs_m, row_ok),
                row_ok,
                True,
                "q",
                signed_pos=True,
            )
            q_tile = kb.cast(q_x, self.dtype, hint="q_tile")
        else:
            q_tile = load_q(offs_d, "q_tile")

        k_base = kb.add(kb.add(k.ptr, kb.mul(b_off, k.strides[0])), kb.mul(hk_off, k.strides[1]), hint="k_base")
        v_base = kb.add(kb.add(v.ptr, kb.mul(b_off, v.strides[0])), kb.mul(hk_off, v.strides[1]), hint="v_base")
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
        )

    def kv_step(
        self, ib: KernelBuilder, p: Params, qb: QBlock, start_n: SSAValue, c: dict[str, SSAValue], masked: bool
    ) -> dict[str, SSAValue]:
        """One KV block: scores, score ops (and masks when `masked`), the online softmax
        update in base 2, and P @ V into the accumulator."""
        rows_n = ib.arange(qb.block_n, hint="rows_n")
        offs_n = ib.add(start_n, rows_n, hint="offs_n")
        kv_ok = ib.cmp("<", offs_n, qb.nk, hint="kv_ok") if masked else None
        n_off = ib.cast(start_n, i64, hint="n_off")
        k, v = qb.k, qb.v
        k_blk = ib.add(qb.k_base, ib.mul(n_off, k.strides[2]), hint="k_blk")

        def load_k(chans: SSAValue) -> SSAValue:
            return self.qk.load_tile(ib, k_blk, rows_n, kv_ok, k.strides[2], k.strides[3], chans, False, "k")

        if self.k_placement == Placement.KV_LOOP:
            k_pos = self.positions(ib, p, self.chains.k_chain, offs_n, qb.b_off, offs_n, kv_ok)
            k_x = self.qk.transformed(ib, p, self.chains.k_chain, load_k, k_pos, kv_ok, False, "k")
            k_tile = ib.cast(k_x, self.kdtype, hint="k_tile")
        else:
            k_tile = load_k(qb.offs_d)
        s = ib.mul(ib.dot(qb.q_tile, k_tile, None, self.precision), self.score_scale, hint="s")
        kv_idx = ib.col(offs_n)
        if masked:
            assert kv_ok is not None
            kv_ok_col = ib.col(kv_ok)
            valid = ib.and_(ib.row(qb.row_ok), kv_ok_col)
        else:
            kv_ok_col = valid = ib.row(qb.row_ok)
        ctx = ScoreCtx(qb.b, qb.h, qb.b_off, qb.q_idx, kv_idx, kv_ok_col, valid, qb.doc_q, self.fast_tanh)
        s = self.score_ops(ib, p, s, ctx, masked)
        if not self.log2e_folded:
            s = ib.mul(s, LOG2E, hint="s2")
        if masked:
            s = ib.where(kv_ok_col, s, NEG_INF, hint="s_valid")
        m_new = ib.maximum(c["m_i"], ib.reduce("max", s, 1), hint="m_new")
        m_safe = ib.where(ib.cmp("==", m_new, NEG_INF), 0.0, m_new, hint="m_safe")
        pr = ib.unary(tl.Exp2Op, ib.sub(s, ib.row(m_safe)), hint="p")
        alpha = ib.unary(tl.Exp2Op, ib.sub(c["m_i"], m_safe), hint="alpha")
        l_new = ib.add(ib.mul(c["l_i"], alpha), ib.reduce("sum", pr, 1), hint="l_new")
        acc_s = ib.mul(c["acc"], ib.row(alpha), hint="acc_scaled")
        v_blk = ib.add(qb.v_base, ib.mul(n_off, v.strides[2]), hint="v_blk")
        v_ptr = ib.add(
            ib.add(v_blk, ib.mul(ib.row(rows_n), v.strides[2])),
            ib.mul(ib.col(qb.offs_dv), v.strides[3]),
            hint="v_ptr",
        )
        vmask = ib.row(kv_ok) if kv_ok is not None else None
        if qb.dv_ok is not None:
            vmask = ib.col(qb.dv_ok) if vmask is None else ib.and_(vmask, ib.col(qb.dv_ok))
        vv = ib.load(v_ptr, vmask, 0.0, hint="v")
        if not masked:
            acc_n = ib.dot(ib.cast(pr, self.vdtype), vv, acc_s, self.precision, hint="acc_new")
            return {"m_i": m_new, "l_i": l_new, "acc": acc_n}
        # A partial block reads V only where the mask keeps the key: a NaN or Inf at a masked
        # key (garbage in an unused cache slot) must not reach a row as 0 * NaN. Non-finite
        # values are zeroed for the product, and the rows and channels that keep such a key
        # get NaN, as they would in a full block.
        v_bad = ib.or_(ib.cmp("!=", vv, vv), ib.cmp("==", ib.unary(tl.AbsOp, vv), POS_INF), hint="v_bad")
        v_clean = ib.where(v_bad, 0.0, vv, hint="v_clean")
        acc_n = ib.dot(ib.cast(pr, self.vdtype), v_clean, acc_s, self.precision, hint="acc_new")
        kept = ib.cast(ib.cmp("!=", s, NEG_INF), self.vdtype, hint="kept")
        hits = ib.dot(kept, ib.cast(v_bad, self.vdtype), None, self.precision, hint="v_bad_hits")
        acc_n = ib.where(ib.cmp(">", hits, 0.0), NAN, acc_n, hint="acc_new")
        return {"m_i": m_new, "l_i": l_new, "acc": acc_n}

    def epilogue(self, kb: KernelBuilder, p: Params, qb: QBlock, carried: dict[str, SSAValue]) -> None:
        """Count the sink, normalise, store the output and the log-sum-exp."""
        m_i, l_i, acc = carried["m_i"], carried["l_i"], carried["acc"]
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
        lse_row = kb.add(kb.mul(kb.cast(qb.pid_bh, i64), qb.nq), qb.m_off)
        kb.store(kb.add(kb.add(qb.lse, lse_row, hint="lse_base"), qb.rows_m), lse, qb.row_ok)

    # ------------------------------------------------------------------ the pre-rotation kernels
    def rotate_kernel(self, which: str = "k") -> KernelCall:
        """`rotate_k` (or `rotate_q`): apply K's (Q's) transforms once, writing a
        transformed copy `k_rot` (`q_rot`)."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        chains = self.chains
        is_q = which == "q"
        arg, chain = (chains.q_arg, chains.q_chain) if is_q else (chains.k_arg, chains.k_chain)
        heads, dtype = (self.hq, self.dtype) if is_q else (self.hkv, self.kdtype)
        x = self.tensor(p, arg)
        rot_ptr = p.param(f"{which.upper()}_rot", tl.PointerType(dtype), f"{which}_rot")
        rot_strides = [p.param(f"stride_{which}r_{d}", i32, f"{which}_rot.stride({d})") for d in range(4)]
        name = self.host_name(arg)
        n = p.param("NQ" if is_q else "NK", i32, f"{name}.shape[2]")
        block_n = p.param("BLOCK_N", i32, str(PREROTATE.block_n), constexpr=True)
        pid_n = kb.emit(tl.ProgramIdOp(0), "pid_n")
        pid_bh = kb.emit(tl.ProgramIdOp(1), "pid_bh")
        b_off = kb.cast(kb.floordiv(pid_bh, heads), i64, hint="b_off")
        h_off = kb.cast(kb.rem(pid_bh, heads), i64, hint="h_off" if is_q else "hk_off")
        n_start = kb.mul(pid_n, block_n, hint="n_start")
        n_off = kb.cast(n_start, i64, hint="n_off")
        rows = kb.arange(block_n, hint="rows_n")
        offs_n = kb.add(n_start, rows, hint="offs_n")
        ok = kb.cmp("<", offs_n, n, hint="row_ok")
        pos = offs_n
        if is_q:  # queries are the last NQ of the NK positions
            nk = p.param("NK", i32, f"{self.host_name(chains.k_arg)}.shape[2]")
            pos = kb.add(offs_n, kb.sub(nk, n), hint="q_pos")

        def base_of(ptr: SSAValue, strides: list[SSAValue], hint: str) -> SSAValue:
            """The tile's first row: batch, head and row offsets in int64."""
            bh = kb.add(kb.add(ptr, kb.mul(b_off, strides[0])), kb.mul(h_off, strides[1]))
            return kb.add(bh, kb.mul(n_off, strides[2]), hint=hint)

        base = base_of(x.ptr, x.strides, f"{which}_base")
        pos = self.positions(kb, p, chain, pos, b_off, offs_n, ok)
        x_t = self.qk.transformed(
            kb,
            p,
            chain,
            lambda chans: self.qk.load_tile(kb, base, rows, ok, x.strides[2], x.strides[3], chans, True, which),
            pos,
            ok,
            True,
            which,
            signed_pos=is_q,
        )
        offs_d = kb.arange(self.dpad, hint="offs_d")
        out_base = base_of(rot_ptr, rot_strides, f"{which}_rot_base")
        ptr = kb.add(
            kb.add(out_base, kb.mul(kb.row(rows), rot_strides[2])),
            kb.mul(kb.col(offs_d), rot_strides[3]),
            hint=f"{which}_rot_ptr",
        )
        mask = kb.row(ok)
        if self.dpad != self.d:
            mask = kb.and_(mask, kb.col(kb.cmp("<", offs_d, self.d)))
        kb.store(ptr, kb.cast(x_t, dtype), mask)
        p.block.add_op(tl.ReturnOp())
        grid = [f"_cdiv({name}.shape[2], {PREROTATE.block_n})", f"{name}.shape[0] * {heads}"]
        return KernelCall(self.kernel(f"rotate_{which}", p), p, grid, PREROTATE.num_warps, PREROTATE.num_stages)

    # ------------------------------------------------------------------ kernels and launcher
    def kernel(self, name: str, p: Params) -> tl.KernelOp:
        """A `tl.kernel` holding the built body (with the arguments it created)."""
        arg_types = [a.type for a in p.block.args]
        kernel = tl.KernelOp(
            name, arg_types, [a.name_hint or f"a{i}" for i, a in enumerate(p.block.args)], p.constexprs
        )
        old = kernel.body.block
        kernel.body.detach_block(old)
        kernel.body.add_block(p.block)
        _erase_dead(p.block)
        return kernel

    @staticmethod
    def alloc_like(var: str, like: str, heads: int, dim: int, dtype: Attribute) -> tl.AllocOp:
        """`var = torch.empty` of [B, heads, N, dim] in `dtype`, B and N (and the device) those
        of the launcher's tensor `like`."""
        return tl.AllocOp(
            var,
            [f"{like}.shape[0]", str(heads), f"{like}.shape[2]", str(dim)],
            dtype_name(dtype, "torch"),
            f"{like}.device",
        )

    def launcher(self, calls: list[KernelCall], gluon: GluonLaunch | None = None) -> tl.LauncherOp:
        """`launch`: allocate the outputs (and K's transformed copy), build the RoPE tables,
        run the kernels in order, return (out, lse). With `gluon` (kernel-path chose the sm90
        Gluon kernel), the last kernel's launch becomes a per-call choice between the two."""
        q, k = self.host_name(self.chains.q_arg), self.host_name(self.chains.k_arg)
        ops: list[Operation] = [
            self.alloc_like("out", q, self.hq, self.dv, self.dtype),
            tl.AllocOp(
                "lse", [f"{q}.shape[0]", str(self.hq), f"{q}.shape[2]"], "torch.float32", f"{q}.device", given=True
            ),
        ]
        if self.k_placement == Placement.PREROTATE:
            ops.append(self.alloc_like("k_rot", k, self.hkv, self.d, self.kdtype))
        ops += self.rope_host_ops(f"{q}.device")
        for c in calls:
            ops.append(tl.CallOp(c.kernel.sym_name.data, c.grid, c.params.host, c.num_warps, c.num_stages))
        if gluon is not None:
            ops[-1:] = [self.gluon_dispatch(gluon, ops[-1])]
        ops.append(tl.HostReturnOp(["out", "lse"]))
        return tl.LauncherOp("launch", self.names, ops)

    def gluon_dispatch(self, gluon: GluonLaunch, generic: Operation) -> tl.HostIfOp:
        """`if _gluon_fits(...)`: Q's transforms (when it has any) by `rotate_q`, then the
        sm90 Gluon kernel on the transformed Q and K; else the generic kernel's launch."""
        chains = self.chains
        q, k, v = (self.host_name(a) for a in (chains.q_arg, chains.k_arg, chains.v_arg))
        then: list[Operation] = []
        q_in = q
        if gluon.rotate_q is not None:
            c = gluon.rotate_q
            then.append(self.alloc_like("q_rot", q, self.hq, self.d, self.dtype))
            then.append(tl.CallOp(c.kernel.sym_name.data, c.grid, c.params.host, c.num_warps, c.num_stages))
            q_in = "q_rot"
        k_in = "k_rot" if self.k_placement == Placement.PREROTATE else k
        fns = gluon.functions
        sink = self.host_name(chains.softmax.sink) if chains.softmax.sink is not None else None
        scale = chains.qk.effective_scale
        if fns is None:
            causal = any(m.kind.data == "causal" for m in chains.masks)
            then.append(
                tl.GluonAttentionOp(
                    q_in, k_in, v, "out", "lse", scale, causal, sink, rope=gluon.q_rope, q_norm=gluon.q_norm
                )
            )
        else:
            full = fns.score_full.sym_name.data if fns.score_full is not None else None
            hooks = (fns.range_fn.sym_name.data, full, fns.score_masked.sym_name.data)
            then.append(
                tl.GluonAttentionOp(
                    q_in,
                    k_in,
                    v,
                    "out",
                    "lse",
                    scale,
                    False,
                    sink,
                    hooks,
                    fns.natural,
                    fns.args,
                    gluon.q_rope,
                    gluon.q_norm,
                )
            )
        return tl.HostIfOp(f"_gluon_fits({q}, {k}, {v}, {gluon.min_len})", then, [generic])


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
        reserved = n in RESERVED_NAMES or n in HOST_NAMES
        if n in names or reserved or n.startswith(("inv_freq", "rope_", "_", "grad_")):
            n = f"{n}_{i}"
        names.append(n)
    return names


@dataclass(frozen=True)
class ConvertAttnToTlPass(ModulePass):
    """Replace each attention function by its Triton kernel(s) (`tl.kernel`) and a host
    launcher (`tl.launcher @launch`) that allocates the outputs and launches them; a
    backward function (attn-autodiff's) by the backward's kernels (`backward_to_tl`)."""

    name = "convert-attn-to-tl"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        funcs = variant_funcs(op)
        if len(funcs) > 1:
            raise DiagnosticException(
                "convert-attn-to-tl lowers one attention function per module, found "
                f"{len(funcs)}: split the input (e.g. --split-input-file)"
            )
        for f in funcs:
            chains = analyse(f)
            functions: list[tl.DeviceFnOp] = []
            if chains.is_backward:
                from attnfuse.passes.backward_to_tl import BackwardLowering

                backward = BackwardLowering(chains, arg_names(f))
                calls = backward.kernels()
                launcher = backward.backward_launcher(calls)
            else:
                lowering = Lowering(chains, arg_names(f))
                calls: list[KernelCall] = []
                if lowering.k_placement == Placement.PREROTATE:
                    calls.append(lowering.rotate_kernel())
                calls.append(lowering.main_kernel())
                path, min_len = kernel_path(f)
                gluon = None
                if path == GLUON:
                    q_own = lowering.gluon_q_transforms()
                    rotate_q = lowering.rotate_kernel("q") if chains.q_chain and q_own is None else None
                    q_rope, q_norm = q_own if q_own is not None else (None, None)
                    gluon = GluonLaunch(rotate_q, min_len, lowering.gluon_functions(), q_rope, q_norm)
                    functions = gluon.functions.ops if gluon.functions is not None else []
                launcher = lowering.launcher(calls, gluon)
                if gluon is not None and gluon.rotate_q is not None:
                    calls.insert(-1, gluon.rotate_q)  # its kernel, defined before the main one
            block = f.parent_block()
            assert block is not None
            block.insert_ops_before([*(call.kernel for call in calls), *functions, launcher], f)
            f.detach()
            f.erase()
