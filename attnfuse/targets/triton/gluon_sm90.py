# type: ignore
"""The sm90 Gluon attention kernel: the core that the `gluon-sm90` kernel path launches.

Generated modules whose launcher holds a `tl.gluon_attention` op carry this file's code, from
its first `triton.experimental` import on, after that of `gluon_common.py` (the tile order, the
TMA ring and its mbarriers, the ping-pong the sm90 kernels share; `printer.gluon_source`), as
they carry the prelude; here it is an ordinary module, linted and compiled for sm90 by the tests.
Its host side, `_gluon_attention`, is `gluon_launch.py`, carried after it.

What it computes: out = softmax(score ops(q·kᵀ·scale)) v and lse (natural log, fp32), for
q [B, Hq, N, D] and k, v [B, Hkv, N, D] (GQA: Hq a multiple of Hkv), bf16 or fp16, D 64, 128
or 256, N a multiple of 128 and Nq = Nk; each of q, k, v and out contiguous or, as transformers
lays them out, a [B, N, H, D] tensor seen through transpose(1, 2) (read and written in place,
`_gl_at`). K arrives with its transforms applied (a pre-rotation kernel); Q either too, or the
consumers apply its RMSNorm and RoPE to their rows of the Q tile in shared memory before the
first wgmma (`_gl_rows_prologue`, its cos/sin from the launcher's tables). The score ops are a causal
mask or none, applied here, or the variant's own, as `@triton.jit` functions the compiler
generates (`RANGE`: the KV blocks a Q tile visits; `SCORE_FULL` / `SCORE_MASKED`: the scores
of unmasked and masked blocks), called with their extra arguments `XARGS`. A per-head sink
logit joins the softmax's denominator in the epilogue.

How (FlashAttention-3's structure in Triton 3.6's Gluon, measured on the H200 in
benchmarks/gluon/, "v4"): one CTA per Q tile of 64 rows per consumer warpgroup (`_gl_consumers`:
128 rows, or 192 at head dim 64 past N = 2048, or 64 at head dim 256 up to N = 1024), heaviest
causal tiles launched first.
- A 1-warp producer partition loads Q once (a 64-row box per consumer) and streams K/V blocks
  through a ring of shared buffers with TMA (3-deep; 2-deep at head dim 256), each slot guarded
  by K-ready / V-ready and K-empty / V-empty mbarriers: a K block is released once its S = Q·Kᵀ
  is done and its softmax run, a step before its V block (after its P·V product), so the next K
  load starts a step earlier (FlashAttention-3's separate K and V pipelines). With the 2-deep ring
  of head dim 256 that made the kernel 1.15-1.31x as fast (H200, benchmarks/NOTES.md,
  2026-12-04); at 64 and 128 no change beyond the spread.
- Two (three at head dim 64 past N = 2048, one at 256 up to 1024) 4-warp consumer partitions (one
  warpgroup, 64 rows each); two take turns issuing their asynchronous wgmmas (ping-pong, through turn mbarriers), so one
  warpgroup's softmax runs while the other's matrix products occupy the tensor cores; inside
  each, S_{j+1} =
  Q·K_{j+1}ᵀ and O += P_j·V_j are in flight while softmax_{j+1} runs (P from registers).
- Base-2 online softmax with the score scale · log2(e) folded into one multiply; causal rows
  visit their unmasked blocks without mask code, then the diagonal block masked.
- O leaves through shared memory (the Q tile's) and a TMA store.

The FP8 form (`fp8_scales`): q, k e4m3 and v e4m3 channel-major (its blocks [D, 128] by TMA), the
same structure with e4m3 wgmmas; S times the q and k block scales, P times 2^8 rounded to e4m3
through a shared tile per warpgroup (Triton 3.6 cannot wait on an 8-bit register operand), the
accumulator kept in units of the V block's scale / 2^8, O through its own shared buffer.
"""

# Gluon kernels are a DSL that Triton traces (constexpr arguments, layouts as values), not
# Python that a static type checker can follow; pyright skips this file.

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from attnfuse.targets.triton.gluon_common import (
    _gl_at,
    _gl_barriers,
    _gl_block_classes,
    _gl_pack16,
    _gl_ring_alloc,
    _gl_ring_init,
    _gl_ring_load,
    _gl_ring_release,
    _gl_ring_wait,
    _gl_ring_wait_free,
    _gl_rope_tables,
    _gl_rows_prologue,
    _gl_tile_order,
    _gl_turn_end,
    _gl_turn_start,
    _gl_turns_init,
)

# fmt: off
_GL_BLOCK = 128


def _gl_kv_rows(head_d):
    """Keys per K/V block and ring depth: 128 keys in a 3-deep ring up to head dim 128; at 256,
    64 keys in a 2-deep ring (shared memory: the Q tile and four 32 KB blocks)."""
    return (_GL_BLOCK, 3) if head_d <= 128 else (_GL_BLOCK // 2, 2)


_GL_CONSUMERS = {64: (3, False), 128: (2, True), 256: (2, True)}
"""Per head dim, the consumer warpgroups of 64 rows (the Q tile is 64 x that) and whether they
take turns issuing wgmmas (ping-pong). At 64, FlashAttention-3's schedule: a 192-row tile over
three warpgroups, each overlapping its own softmax with its products. The FP8 form keeps two."""
_GL_CONSUMERS_SHORT = {64: (2048, (2, False)), 256: (1024, (1, False))}
"""Per head dim, (N, schedule): the schedule for sequences up to N. At 64, two warpgroups over
128-row tiles: 1.0-1.24x three at N = 512-2048, 1.76x with RoPE at 512 (a short sequence has
few tiles, the last of 192 rows often part empty; H200, run_2026-12-03_short_d64_d256); three
were up to 10% faster from 4096 (run_2026-12-02_d64). At 256, one warpgroup over 64-row tiles
(twice the programs, so that the causal work spreads over the SMs): 1.25-1.30x two at N = 512
and 1024, 0.82x at 2048 (run_2026-12-03_d256_short)."""


def _gl_consumers(head_d, n):
    """The consumer schedule (warpgroups, ping-pong) of the Gluon forward at head dim `head_d`
    for sequences of n rows."""
    short = _GL_CONSUMERS_SHORT.get(head_d)
    return short[1] if short is not None and n <= short[0] else _GL_CONSUMERS[head_d]


_GL_LOG2E = 1.4426950408889634


@gluon.jit
def _gl_tile(N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, RANGE: gl.constexpr):
    """This program's batch*head, Q tile (heaviest first) and its KV blocks (for the tile's
    rows below N; where a row is in a descriptor's view: `_gl_at`): it visits
    blocks [j0, j_end); block j0 and blocks [j0 + 1, a) and [b, j_end) are masked, blocks
    [a, b) need no mask. Without a RANGE hook the mask is causal or none; with one,
    RANGE(q_lo, q_hi, N) gives the keys some query of the tile keeps, [lo, hi), and those every
    query keeps, [full_lo, full_hi)."""
    off_hz, pid_m = _gl_tile_order()
    q_last = gl.minimum(pid_m * BLOCK_M + BLOCK_M, N) - 1  # a last tile may end past N (192-row tiles)
    if RANGE is not None:
        lo, f_lo, f_hi, hi = RANGE(pid_m * BLOCK_M, q_last, N)
        j0, a, b, j_end = _gl_block_classes(lo, f_lo, f_hi, hi, BLOCK_N)
    elif CAUSAL:
        j0 = 0
        a = 1
        b = gl.maximum((pid_m * BLOCK_M) // BLOCK_N, 1)
        j_end = q_last // BLOCK_N + 1
    else:
        j0 = 0
        a = 1
        b = N // BLOCK_N
        j_end = b
    return off_hz, pid_m, j0, a, b, j_end


@gluon.jit
def _gl_scores(s, q_pos, k_pos, off_hz, qk_scale, XARGS, HOOK: gl.constexpr, NATURAL: gl.constexpr):
    """A raw score block with the variant's score ops applied by HOOK, a generated
    `@triton.jit` function of (s, q_idx, kv_idx, off_hz, *XARGS). NATURAL: the ops read the
    scaled scores (softcap, biases, score_mod); otherwise they are masks and see raw ones."""
    if NATURAL:
        s = s * qk_scale
    if HOOK is not None:
        s = HOOK(s, q_pos[:, None], k_pos[None, :], off_hz, *XARGS)
    return s


@gluon.jit
def _gl_softmax(s, m_i, l_i, mult, q_pos, k_pos, MASKED: gl.constexpr, SAFE: gl.constexpr):
    """One score block's base-2 online softmax step (s·mult are base-2 logits): P
    (unnormalised), the output's rescale factor, the new running max and row sum. MASKED:
    the causal mask of the kernel without hooks; SAFE: a row may have kept no score yet."""
    if MASKED:
        s = gl.where(q_pos[:, None] >= k_pos[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * mult)
    if SAFE:
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = gl.exp2(s * mult - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _gl_q_ready(q_tile, q_bar, rope, q_norm, row0, N, batch):
    """Wait for a consumer's rows of the Q tile, then apply Q's transforms to them, if any
    (`_gl_rows_prologue`; RoPE's tables read before the wait, `_gl_rope_tables`)."""
    ROWS: gl.constexpr = q_tile.shape[0]
    trig = (None, None)
    if rope[0] is not None:
        trig = _gl_rope_tables(rope, ROWS, q_tile.shape[1] // 2, row0, N, batch)
    mbarrier.wait(q_bar, 0)
    if rope[0] is not None or q_norm[1] is not None:
        _gl_rows_prologue(q_tile, trig, q_norm)


@gluon.jit
def _gl_fp8_block(fp8, j, BLOCK_N: gl.constexpr):
    """The scales of KV block j in the FP8 form: (q's scale times k's, v's)."""
    sq, k_scales, v_scales, kv_base, kv_rows = fp8
    idx = kv_base + (j * BLOCK_N) // kv_rows
    return sq * gl.load(k_scales + idx), gl.load(v_scales + idx)


@gluon.jit
def _gl_fp8_setup(fp8_scales, off_hz, GROUP, row0):
    """What a consumer's KV steps read in the FP8 form (None otherwise): its rows' q scale, the
    k and v scales and where its KV head's start, and their keys per scale."""
    fp8 = None
    if fp8_scales is not None:
        q_scales, k_scales, v_scales, q_blocks, q_rows, kv_blocks, kv_rows = fp8_scales
        sq = gl.load(q_scales + off_hz * q_blocks + row0 // q_rows)
        fp8 = (sq, k_scales, v_scales, (off_hz // GROUP) * kv_blocks, kv_rows)
    return fp8


@gluon.jit
def _gl_sink(acc, m_i, l_i, sink_ptr):
    """The sink's logit (at sink_ptr) joins every row's denominator."""
    sink = gl.load(sink_ptr).to(gl.float32) * 1.4426950408889634
    m_new = gl.maximum(m_i, sink)
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.exp2(sink - m_new)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    return acc, m_new, l_i


@gluon.jit
def _gl_normalised(acc, l_o, unit, FP8: gl.constexpr):
    """O = acc / l, the accumulator in units of `unit` in the FP8 form."""
    if FP8:
        o = acc * (unit / l_o)[:, None]
    else:
        o = acc / l_o[:, None]
    return o


@gluon.jit
def _gl_v_operand(v_smem, slot, FP8: gl.constexpr):
    """The B operand of P·V from a V ring slot: the block itself, or (FP8, whose V blocks are
    channel-major [D, BLOCK_N] as e4m3 products want) its transpose view."""
    v = v_smem.index(slot)
    if FP8:
        v = v.permute((1, 0))
    return v


@gluon.jit
def _gl_p_tile(p, p_tile):
    """FP8: P times 2^8 rounded to e4m3 into the consumer's shared tile, the A operand of P·V
    (an e4m3 operand in registers cannot be tracked by the wgmma wait)."""
    p_tile.store((p * 256.0).to(p_tile.dtype))
    fence_async_shared()
    gl.thread_barrier()
    return p_tile


@gluon.jit
def _gl_blocks(descs, bufs, q_tile, acc, m_i, l_i, p_op, unit, scales, fp8, q_pos, off_hz, XARGS, j0, lo, hi,
               MASKED: gl.constexpr, HOOK: gl.constexpr, NATURAL: gl.constexpr, SAFE: gl.constexpr,
               STAGES: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """KV blocks [lo, hi), lo > j0 (the tile's first block, whose ring slot is 0). On entry
    `p_op` holds P of block lo-1, not yet multiplied by its V. Per block j: issue S_j =
    Q·K_jᵀ and O += P_{j-1}·V_{j-1}, wait for S_j only, score ops and softmax_j, then wait for
    the P·V, release V_{j-1} and K_j, and rescale O. FP8 (`fp8` not None): S_j times the block's
    scales, P_j times 2^8 in e4m3, and O kept in units of the block's V scale / 2^8 (`unit`)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, o_smem, p_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    k_empty, v_empty = empty_bars
    qk_scale, mult = scales
    FP8: gl.constexpr = fp8 is not None
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    s_layout: gl.constexpr = q_pos.type.layout.parent
    s_zero = gl.zeros([q_pos.shape[0], BLOCK_N], gl.float32, s_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for j in range(lo, hi):
        i = j - j0
        slot = i % STAGES
        prev = (i - 1) % STAGES
        if FP8:  # the block's scales, loaded while its products run
            s_qk, s_v = _gl_fp8_block(fp8, j, BLOCK_N)
        _gl_ring_wait(k_bars, i, STAGES)
        _gl_ring_wait(v_bars, i - 1, STAGES)
        _gl_turn_start(turn_bars, i, WG, PINGPONG)
        s = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, _gl_v_operand(v_smem, prev, FP8), acc, is_async=True)
        _gl_turn_end(turn_bars, WG, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        k_pos = j * BLOCK_N + cols
        if FP8:
            s = s * s_qk
        s = _gl_scores(s, q_pos, k_pos, off_hz, qk_scale, XARGS, HOOK, NATURAL)
        p, alpha, m_i, l_i = _gl_softmax(s, m_i, l_i, mult, q_pos, k_pos, MASKED, SAFE)
        if FP8:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        else:
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        gl.thread_barrier()
        _gl_ring_release(v_empty, i - 1, STAGES)  # V_{j-1}
        _gl_ring_release(k_empty, i, STAGES)  # K_j
        if FP8:
            new_unit = s_v * 0.00390625
            alpha = alpha * (unit / new_unit)
            unit = new_unit
            p_op = _gl_p_tile(p, p_op)
        else:
            p_op = gl.convert_layout(_gl_pack16(p, k_desc.dtype), p_op.type.layout)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    return acc, m_i, l_i, p_op, unit


@gluon.jit
def _gl_consumer(descs, bufs, lse_ptr, sink_ptr, rope, q_norm, scales, fp8_scales, N, GROUP, HEADS, XARGS,
                 CAUSAL: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, RANGE: gl.constexpr,
                 SCORE_FULL: gl.constexpr, SCORE_MASKED: gl.constexpr, NATURAL: gl.constexpr,
                 PINGPONG: gl.constexpr, INNER: gl.constexpr):
    """The 64 rows of the Q tile that consumer WG owns: its first KV block (masked), the
    masked blocks before the unmasked ones (RANGE hooks only), the unmasked blocks, the
    masked blocks after them, the last P·V, the epilogue (the sink's logit; O = acc / l
    through shared memory and a TMA store; lse = (m + log2 l)·ln 2; a row that kept no score
    gives zeros and lse = -inf). FP8: `fp8_scales` = (q's, k's and v's scales, the scale blocks
    per (batch, head) of q and of k and v, their rows), one scale per 64 rows of q and per
    128 keys (or one per tensor: 0 blocks)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, o_smem, p_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    k_empty, v_empty = empty_bars
    qk_scale, mult = scales
    FP8: gl.constexpr = fp8_scales is not None
    BITS: gl.constexpr = q_desc.dtype.primitive_bitwidth
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[0] * ROWS  # the Q tile: one box of ROWS per consumer
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    ROW0: gl.constexpr = ROWS * WG
    SAFE: gl.constexpr = RANGE is not None
    warps: gl.constexpr = [gl.num_warps(), 1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, BLOCK_N, 256 // BITS])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, HEAD_D, 256 // BITS])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=32 // BITS)
    off_hz, pid_m, j0, a, b, j_end = _gl_tile(N, BLOCK_M, BLOCK_N, CAUSAL, RANGE)
    fp8 = _gl_fp8_setup(fp8_scales, off_hz, GROUP, pid_m * BLOCK_M + ROW0)
    unit = 1.0
    q_tile = q_smem.index(WG)
    # Rows past N (a last 192-row tile) compute as row N - 1 (hooks index tensors by position).
    q_pos = gl.minimum(pid_m * BLOCK_M + ROW0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout)), N - 1)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, HEAD_D], gl.float32, o_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)

    _gl_q_ready(q_tile, q_bar, rope, q_norm, pid_m * BLOCK_M + ROW0, N, off_hz // HEADS)
    _gl_ring_wait(k_bars, 0, STAGES)
    _gl_turn_start(turn_bars, 0, WG, PINGPONG)
    s = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _gl_turn_end(turn_bars, WG, PINGPONG)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    gl.thread_barrier()
    _gl_ring_release(k_empty, 0, STAGES)  # K_{j0}
    k_pos = j0 * BLOCK_N + cols
    if FP8:
        s_qk, s_v = _gl_fp8_block(fp8, j0, BLOCK_N)
        s = s * s_qk
    s = _gl_scores(s, q_pos, k_pos, off_hz, qk_scale, XARGS, SCORE_MASKED, NATURAL)
    p, alpha, m_i, l_i = _gl_softmax(s, m_i, l_i, mult, q_pos, k_pos, CAUSAL, SAFE)
    if FP8:
        unit = s_v * 0.00390625
        p_op = _gl_p_tile(p, p_smem.index(WG))
    else:
        p_op = gl.convert_layout(_gl_pack16(p, q_desc.dtype), p_layout)
    if RANGE is not None:
        acc, m_i, l_i, p_op, unit = _gl_blocks(descs, bufs, q_tile, acc, m_i, l_i, p_op, unit, scales, fp8, q_pos,
                                               off_hz, XARGS, j0, j0 + 1, a, False, SCORE_MASKED, NATURAL, SAFE,
                                               STAGES, WG, PINGPONG)
    acc, m_i, l_i, p_op, unit = _gl_blocks(descs, bufs, q_tile, acc, m_i, l_i, p_op, unit, scales, fp8, q_pos, off_hz,
                                           XARGS, j0, a, b, False, SCORE_FULL, NATURAL, SAFE, STAGES, WG, PINGPONG)
    if CAUSAL or RANGE is not None:
        acc, m_i, l_i, p_op, unit = _gl_blocks(descs, bufs, q_tile, acc, m_i, l_i, p_op, unit, scales, fp8, q_pos,
                                               off_hz, XARGS, j0, b, j_end, CAUSAL, SCORE_MASKED, NATURAL, SAFE,
                                               STAGES, WG, PINGPONG)
    last = j_end - 1 - j0
    _gl_ring_wait(v_bars, last, STAGES)
    _gl_turn_start(turn_bars, last + 1, WG, PINGPONG)
    acc = warpgroup_mma(p_op, _gl_v_operand(v_smem, last % STAGES, FP8), acc, is_async=True)
    _gl_turn_end(turn_bars, WG, PINGPONG)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    if sink_ptr is not None:
        acc, m_i, l_i = _gl_sink(acc, m_i, l_i, sink_ptr + off_hz % HEADS)
    if SAFE:
        empty = l_i == 0.0
        l_i = gl.where(empty, 1.0, l_i)
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    if SAFE:
        lse = gl.where(empty, float("-inf"), lse)
    if pid_m * BLOCK_M + ROW0 < N:  # a warpgroup of a last tile past N (192-row tiles) writes nothing
        o_tile = o_smem.index(WG)
        o_tile.store(_gl_normalised(acc, l_o, unit, FP8).to(o_desc.dtype))
        fence_async_shared()
        o_row, o_col = _gl_at(INNER[3], off_hz, HEADS, N, pid_m * BLOCK_M + ROW0, HEAD_D)
        tma.async_copy_shared_to_global(o_desc, [o_row, o_col], o_tile)
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        gl.store(lse_ptr + off_hz * N + pid_m * BLOCK_M + ROW0 + rows, lse)
        tma.store_wait(pendings=0)


@gluon.jit
def _gl_producer(descs, bufs, fp8_scales, N, GROUP, HEADS, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                 RANGE: gl.constexpr, INNER: gl.constexpr):
    """The load partition: Q once, then K/V block j into ring slot (j - j0) % STAGES once both
    consumers released the block that used the slot before (the first STAGES waits pass at
    once). FP8 (`fp8_scales` not None): V's blocks are channel-major, [D, BLOCK_N]."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, o_smem, p_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    k_empty, v_empty = empty_bars
    Q_BOXES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = Q_BOXES * q_desc.block_type.shape[0]  # the Q tile, one box per consumer
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    V_T: gl.constexpr = fp8_scales is not None
    off_hz, pid_m, j0, a, b, j_end = _gl_tile(N, BLOCK_M, BLOCK_N, CAUSAL, RANGE)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes * Q_BOXES)
    for r in gl.static_range(Q_BOXES):  # a box wholly past the tensor's end lands as zeros
        q_row, q_col = _gl_at(INNER[0], off_hz, HEADS, N, pid_m * BLOCK_M + r * q_desc.block_type.shape[0], HEAD_D)
        tma.async_copy_global_to_shared(q_desc, [q_row, q_col], q_bar, q_smem.index(r))
    for i in range(j_end - j0):
        _gl_ring_wait_free(k_empty, i, STAGES)
        k_row, k_col = _gl_at(INNER[1], off_hz // GROUP, HEADS // GROUP, N, (j0 + i) * BLOCK_N, HEAD_D)
        _gl_ring_load(k_desc, k_row, k_bars, k_smem, i, STAGES, k_col)
        _gl_ring_wait_free(v_empty, i, STAGES)
        if V_T:  # channel-major V (FP8): block [D, BLOCK_N] at the head's channels and the block's keys
            slot = i % STAGES
            mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [(off_hz // GROUP) * HEAD_D, (j0 + i) * BLOCK_N],
                                            v_bars.index(slot), v_smem.index(slot))
        else:
            v_row, v_col = _gl_at(INNER[2], off_hz // GROUP, HEADS // GROUP, N, (j0 + i) * BLOCK_N, HEAD_D)
            _gl_ring_load(v_desc, v_row, v_bars, v_smem, i, STAGES, v_col)


@gluon.jit
def attn_fwd_sm90(q_desc, k_desc, v_desc, o_desc, lse_ptr, sink_ptr, cos_ptr, sin_ptr, rope_rows, qn_w_ptr, qn_eps,
                  qk_scale, mult, fp8_scales, N, GROUP, HEADS, XARGS,
                  CAUSAL: gl.constexpr, STAGES: gl.constexpr, RANGE: gl.constexpr, SCORE_FULL: gl.constexpr,
                  SCORE_MASKED: gl.constexpr, NATURAL: gl.constexpr, CONSUMERS: gl.constexpr,
                  PINGPONG: gl.constexpr, INNER: gl.constexpr = (False, False, False, False)):
    """out, lse of one Q tile of 64·CONSUMERS rows: a TMA producer warp and CONSUMERS (1, 2 or 3)
    consumer warpgroups of 64 rows, taking turns (PINGPONG) or not, sharing a STAGES-deep K/V
    ring (see the module docstring). num_warps=4. The Q descriptor's blocks are the tile; a
    last tile may end past N (3 consumers), its rows from N on computed but not written.
    INNER: whether q, k, v and out (in that order) have their heads inner to their sequence
    (their descriptors then view [B * N, H * D], `_gl_at`), else they are contiguous.

    Scores·mult are the softmax's base-2 logits. Without hooks (RANGE None) the mask is
    causal (CAUSAL) or none and mult = scale·log2 e. With them, the generated RANGE,
    SCORE_FULL and SCORE_MASKED functions (and their arguments XARGS) bound the KV loop and
    apply the variant's score ops, on the scores times qk_scale when NATURAL (mult = log2 e).
    sink_ptr: None, or the per-head sink logits (HEADS of them). cos_ptr, sin_ptr, qn_w_ptr,
    qn_eps: None (Q arrives transformed), or Q's RoPE tables (rope_rows: their rows per sequence,
    0 for tables by position) and RMSNorm (weight or None, eps) that the consumers apply
    (`_gl_rows_prologue`). fp8_scales: None, or the scales of e4m3 q, k and
    v (V channel-major, its descriptor's blocks [D, 128]; see `_gl_consumer`); O is written
    through its own shared buffer then, as its dtype is not Q's."""
    descs = (q_desc, k_desc, v_desc, o_desc)
    scales = (qk_scale, mult)
    rope = (cos_ptr, sin_ptr, rope_rows)
    q_norm = (qn_w_ptr, qn_eps)
    # The Q tile: one box of q_desc's 64 rows per consumer (a 192-row box or buffer is not a
    # power of two), its O box in the same place after the last product.
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_smem = _gl_ring_alloc(k_desc, STAGES)
    v_smem = _gl_ring_alloc(v_desc, STAGES)
    p_smem = q_smem  # unused without fp8_scales (a partition's arguments cannot hold None)
    if fp8_scales is not None:
        ROWS: gl.constexpr = q_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS] + o_desc.block_type.shape, o_desc.layout)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], q_desc.dtype)
        p_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, BLOCK_N], p_layout)
    else:
        o_smem = q_smem
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = _gl_barriers(STAGES)
    v_bars = _gl_barriers(STAGES)
    k_empty = _gl_barriers(STAGES)  # K's slots and V's, released apart (the module docstring)
    v_empty = _gl_barriers(STAGES)
    turn_bars = _gl_barriers(CONSUMERS)
    mbarrier.init(q_bar, count=1)
    _gl_ring_init(k_bars, v_bars, k_empty, STAGES, CONSUMERS, v_empty)  # released by every consumer
    _gl_turns_init(turn_bars)
    fence_async_shared()
    bufs = (q_smem, k_smem, v_smem, o_smem, p_smem, q_bar, k_bars, v_bars, (k_empty, v_empty), turn_bars)
    if CONSUMERS == 3:  # 3 x 128 x 160 + 128 x 24 registers: the register file
        gl.warp_specialize(
            [
                (_gl_consumer, (descs, bufs, lse_ptr, sink_ptr, rope, q_norm, scales, fp8_scales, N, GROUP, HEADS,
                                XARGS, CAUSAL, STAGES, 0, RANGE, SCORE_FULL, SCORE_MASKED, NATURAL, PINGPONG,
                                INNER)),
                (_gl_consumer, (descs, bufs, lse_ptr, sink_ptr, rope, q_norm, scales, fp8_scales, N, GROUP, HEADS,
                                XARGS, CAUSAL, STAGES, 1, RANGE, SCORE_FULL, SCORE_MASKED, NATURAL, PINGPONG,
                                INNER)),
                (_gl_consumer, (descs, bufs, lse_ptr, sink_ptr, rope, q_norm, scales, fp8_scales, N, GROUP, HEADS,
                                XARGS, CAUSAL, STAGES, 2, RANGE, SCORE_FULL, SCORE_MASKED, NATURAL, PINGPONG,
                                INNER)),
                (_gl_producer, (descs, bufs, fp8_scales, N, GROUP, HEADS, CAUSAL, STAGES, RANGE, INNER)),
            ],
            [4, 4, 1],
            [160, 160, 24],
        )
    elif CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_gl_consumer, (descs, bufs, lse_ptr, sink_ptr, rope, q_norm, scales, fp8_scales, N, GROUP, HEADS,
                                XARGS, CAUSAL, STAGES, 0, RANGE, SCORE_FULL, SCORE_MASKED, NATURAL, PINGPONG,
                                INNER)),
                (_gl_consumer, (descs, bufs, lse_ptr, sink_ptr, rope, q_norm, scales, fp8_scales, N, GROUP, HEADS,
                                XARGS, CAUSAL, STAGES, 1, RANGE, SCORE_FULL, SCORE_MASKED, NATURAL, PINGPONG,
                                INNER)),
                (_gl_producer, (descs, bufs, fp8_scales, N, GROUP, HEADS, CAUSAL, STAGES, RANGE, INNER)),
            ],
            [4, 1],
            [240, 24],
        )
    else:  # one warpgroup: 64-row tiles, twice the CTAs of two (short sequences at head dim 256)
        gl.warp_specialize(
            [
                (_gl_consumer, (descs, bufs, lse_ptr, sink_ptr, rope, q_norm, scales, fp8_scales, N, GROUP, HEADS,
                                XARGS, CAUSAL, STAGES, 0, RANGE, SCORE_FULL, SCORE_MASKED, NATURAL, False, INNER)),
                (_gl_producer, (descs, bufs, fp8_scales, N, GROUP, HEADS, CAUSAL, STAGES, RANGE, INNER)),
            ],
            [1],
            [24],
        )
