# type: ignore
"""The sm90 Gluon backward's ordered dQ kernel, `attn_bwd_dq_sm90`: dQ = dS K (unscaled, fp32)
of one query tile by one program, in key order, so bitwise reproducible. The launcher runs it
after the dK/dV kernel (`gluon_bwd_sm90.py`) when dQ is not added up by that kernel's TMA
reduce-adds: under `torch.use_deterministic_algorithms`, or with kernel-path's
`dq-reduce=false`.

Generated modules carry this file's code after `gluon_bwd_sm90.py`'s (`printer.GLUON_BWD_FILES`);
here it is an ordinary module, linted and compiled for sm90 by the tests. q, k, v and dout are
as `attn_bwd_sm90` takes them, with k holding its RoPE (the dK/dV kernel writes the rotated keys
for this kernel when it applies K's RoPE itself).

How: one program per 128 query rows (heaviest first), Q and dO loaded once, K and V blocks
streamed through a TMA ring by a 1-warp producer (`_GLBQ_SCHEDULE`: 128 keys, 2 deep at head dim
64; 64 keys, 3 deep at 128); two consumer warpgroups of 64 rows each (taking turns to issue their
wgmmas at head dim 128): S = Q Kᵀ, dP = dO Vᵀ, (P, dS) by the variant's hook, dQ += dS K with dS
from registers; dQ leaves from registers. ptxas (sm_90a, on the CPU): no spills.
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
    _gl_pack16,
    _gl_ring_alloc,
    _gl_ring_init,
    _gl_ring_load,
    _gl_ring_release,
    _gl_ring_wait,
    _gl_ring_wait_free,
    _gl_tile_order,
    _gl_turn_end,
    _gl_turn_start,
    _gl_turns_init,
)

# fmt: off
_GLBQ_ROWS = 128  # the dQ kernel's Q tile: two consumer warpgroups of 64 rows
_GLBQ_SCHEDULE = {64: (128, 2, False), 128: (64, 3, True)}
# The dQ kernel's schedule per head dim: keys per block of its loop, ring depth, ping-pong
# (its consumers take turns issuing their wgmmas). H200, RoPE + causal at 16k: 128-key blocks
# 5% faster at D 64 (no gain at 128), ping-pong 5% faster at D 128 (10% slower at 64; in the
# dK/dV kernel 17% slower at 128: benchmarks/NOTES.md, 2026-12-03).


@gluon.jit
def _glbq_tile(N, RANGE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The dQ kernel's program: its batch*head, Q tile (heaviest first) and KV blocks: blocks
    [j0, j_end) of BLOCK_N keys are visited, blocks [a, b) need no mask (RANGE gives the keys
    some query of the tile keeps and those all of them keep)."""
    off_hz, pid_m = _gl_tile_order()
    q_lo = pid_m * BLOCK_M
    lo, f_lo, f_hi, hi = RANGE(q_lo, q_lo + BLOCK_M - 1, N)
    j0 = lo // BLOCK_N
    j_end = gl.maximum((hi + BLOCK_N - 1) // BLOCK_N, j0)
    a = gl.minimum(gl.maximum((f_lo + BLOCK_N - 1) // BLOCK_N, j0), j_end)
    b = gl.minimum(gl.maximum(f_hi // BLOCK_N, a), j_end)
    return off_hz, pid_m, j0, a, b, j_end


@gluon.jit
def _glbq_steps(bufs, q_w, do_w, dq, lse2, delta, q_pos, off_hz, XARGS, j0, lo, hi,
                HOOK: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """KV blocks [lo, hi) (ring position j - j0): S = Q Kᵀ and dP = dO Vᵀ, (P, dS) by HOOK,
    dQ += dS K."""
    q_smem, do_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    ROWS: gl.constexpr = q_w.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    warps: gl.constexpr = [gl.num_warps(), 1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, BLOCK_N, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq.type.layout, k_width=2)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for j in range(lo, hi):
        i = j - j0
        slot = i % STAGES
        _gl_ring_wait(k_bars, i, STAGES)
        if PINGPONG:  # both operands in place before the turn is taken
            _gl_ring_wait(v_bars, i, STAGES)
        _gl_turn_start(turn_bars, 2 * i, WG, PINGPONG)
        s = warpgroup_mma(q_w, k_smem.index(slot).permute((1, 0)), gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
                          use_acc=False, is_async=True)
        if not PINGPONG:
            _gl_ring_wait(v_bars, i, STAGES)
        dp = warpgroup_mma(do_w, v_smem.index(slot).permute((1, 0)),
                           gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        _gl_turn_end(turn_bars, WG, PINGPONG)
        s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
        k_pos = j * BLOCK_N + cols
        p, ds = HOOK(s, dp, lse2, delta, q_pos, k_pos[None, :], off_hz, *XARGS)
        ds_op = gl.convert_layout(_gl_pack16(ds, q_w.dtype), op_layout)
        _gl_turn_start(turn_bars, 2 * i + 1, WG, PINGPONG)
        dq = warpgroup_mma(ds_op, k_smem.index(slot), dq, is_async=True)
        _gl_turn_end(turn_bars, WG, PINGPONG)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        gl.thread_barrier()
        _gl_ring_release(empty_bars, i, STAGES)
    return dq


@gluon.jit
def _glbq_consumer(descs, bufs, dq_ptr, lse_ptr, delta_ptr, N, GROUP, XARGS, STAGES: gl.constexpr,
                   WG: gl.constexpr, RANGE: gl.constexpr, HOOK_FULL: gl.constexpr, HOOK_MASKED: gl.constexpr,
                   PINGPONG: gl.constexpr):
    """Rows [64·WG, 64·WG + 64) of the Q tile: dQ over its KV blocks (masked, unmasked,
    masked), stored unscaled in fp32."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    ROWS: gl.constexpr = BLOCK_M // 2
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    warps: gl.constexpr = [gl.num_warps(), 1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, BLOCK_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, HEAD_D, 16])
    off_hz, pid_m, j0, a, b, j_end = _glbq_tile(N, RANGE, BLOCK_M, BLOCK_N)
    row0 = pid_m * BLOCK_M + WG * ROWS
    q_pos = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    lse = gl.load(lse_ptr + off_hz * N + q_pos)
    lse2 = (gl.where(lse == float("-inf"), float("inf"), lse) * 1.4426950408889634)[:, None]
    delta = gl.load(delta_ptr + off_hz * N + q_pos)[:, None]
    dq = gl.zeros([ROWS, HEAD_D], gl.float32, acc_layout)
    mbarrier.wait(q_bar, 0)
    q_w = q_smem.slice(WG * ROWS, ROWS)
    do_w = do_smem.slice(WG * ROWS, ROWS)
    qp = q_pos[:, None]
    dq = _glbq_steps(bufs, q_w, do_w, dq, lse2, delta, qp, off_hz, XARGS, j0, j0, a, HOOK_MASKED, STAGES, WG,
                     PINGPONG)
    dq = _glbq_steps(bufs, q_w, do_w, dq, lse2, delta, qp, off_hz, XARGS, j0, a, b, HOOK_FULL, STAGES, WG,
                     PINGPONG)
    dq = _glbq_steps(bufs, q_w, do_w, dq, lse2, delta, qp, off_hz, XARGS, j0, b, j_end, HOOK_MASKED, STAGES, WG,
                     PINGPONG)
    rows = off_hz * N + row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_layout))
    offs = rows.to(gl.int64)[:, None] * HEAD_D + gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, acc_layout))[None, :]
    gl.store(dq_ptr + offs, dq)


@gluon.jit
def _glbq_producer(descs, bufs, N, GROUP, HEADS, STAGES: gl.constexpr, RANGE: gl.constexpr, INNER: gl.constexpr):
    """The dQ kernel's load partition: Q and dO of the tile once, then K and V of each KV
    block into ring position j - j0 once both consumers released the slot."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    off_hz, pid_m, j0, a, b, j_end = _glbq_tile(N, RANGE, BLOCK_M, BLOCK_N)
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    q_row, q_col = _gl_at(INNER[0], off_hz, HEADS, N, pid_m * BLOCK_M, HEAD_D)
    tma.async_copy_global_to_shared(q_desc, [q_row, q_col], q_bar, q_smem)
    do_row, do_col = _gl_at(INNER[3], off_hz, HEADS, N, pid_m * BLOCK_M, HEAD_D)
    tma.async_copy_global_to_shared(do_desc, [do_row, do_col], q_bar, do_smem)
    for i in range(j_end - j0):
        _gl_ring_wait_free(empty_bars, i, STAGES)
        k_row, k_col = _gl_at(INNER[1], off_hz // GROUP, HEADS // GROUP, N, (j0 + i) * BLOCK_N, HEAD_D)
        _gl_ring_load(k_desc, k_row, k_bars, k_smem, i, STAGES, k_col)
        v_row, v_col = _gl_at(INNER[2], off_hz // GROUP, HEADS // GROUP, N, (j0 + i) * BLOCK_N, HEAD_D)
        _gl_ring_load(v_desc, v_row, v_bars, v_smem, i, STAGES, v_col)


@gluon.jit
def attn_bwd_dq_sm90(q_desc, k_desc, v_desc, do_desc, dq_ptr, lse_ptr, delta_ptr, N, GROUP, HEADS, XARGS,
                     STAGES: gl.constexpr, RANGE: gl.constexpr, HOOK_FULL: gl.constexpr,
                     HOOK_MASKED: gl.constexpr, PINGPONG: gl.constexpr,
                     INNER: gl.constexpr = (False, False, False, False)):
    """dQ (unscaled, fp32, into dq_ptr) of one 128-row Q tile: a TMA producer warp streaming the
    K and V blocks the tile meets through a STAGES-deep ring, and two consumer warpgroups of 64
    rows each doing three wgmmas per block (S, dP, dQ += dS K): the ordered, deterministic dQ
    (no accumulation across programs). num_warps=4. INNER: as `attn_bwd_sm90`'s, of q, k, v, dO."""
    descs = (q_desc, k_desc, v_desc, do_desc)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, do_desc.block_type.shape, do_desc.layout)
    k_smem = _gl_ring_alloc(k_desc, STAGES)
    v_smem = _gl_ring_alloc(v_desc, STAGES)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = _gl_barriers(STAGES)
    v_bars = _gl_barriers(STAGES)
    empty_bars = _gl_barriers(STAGES)
    turn_bars = _gl_barriers(2)
    mbarrier.init(q_bar, count=1)
    _gl_ring_init(k_bars, v_bars, empty_bars, STAGES, 2)  # released by both consumers
    _gl_turns_init(turn_bars)
    fence_async_shared()
    bufs = (q_smem, do_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars)
    gl.warp_specialize(
        [
            (_glbq_consumer, (descs, bufs, dq_ptr, lse_ptr, delta_ptr, N, GROUP, XARGS, STAGES, 0, RANGE, HOOK_FULL,
                              HOOK_MASKED, PINGPONG)),
            (_glbq_consumer, (descs, bufs, dq_ptr, lse_ptr, delta_ptr, N, GROUP, XARGS, STAGES, 1, RANGE, HOOK_FULL,
                              HOOK_MASKED, PINGPONG)),
            (_glbq_producer, (descs, bufs, N, GROUP, HEADS, STAGES, RANGE, INNER)),
        ],
        [4, 1],
        [240, 24],
    )
