# type: ignore
"""The sm90 Gluon attention kernel: the core that the `gluon-sm90` kernel path launches.

Generated modules whose launcher holds a `tl.gluon_attention` op carry this file's code, from
its first `triton.experimental` import on (`printer.gluon_source`), as they carry the
prelude; here it is an ordinary module, linted and compiled for sm90 by the tests.

What it computes: out = softmax(q·kᵀ·scale [causal]) v and lse (natural log, fp32), for
q [B, Hq, N, D] and k, v [B, Hkv, N, D] (GQA: Hq a multiple of Hkv), bf16 or fp16, D 64 or
128, N a multiple of 128 and Nq = Nk. Q and K arrive with their transforms (RoPE, QK-norm)
already applied: the launcher runs the pre-rotation kernels first.

How (FlashAttention-3's structure in Triton 3.6's Gluon, measured on the H200 in
benchmarks/gluon/, "v4"): one CTA per 128-row Q tile, heaviest causal tiles launched first.
- A 1-warp producer partition loads Q once and streams K/V blocks through a 3-deep ring of
  shared buffers with TMA, each slot guarded by K-ready / V-ready / empty mbarriers.
- Two 4-warp consumer partitions (one warpgroup, 64 rows each) take turns issuing their
  asynchronous wgmmas (ping-pong, through two turn mbarriers), so one warpgroup's softmax
  runs while the other's matrix products occupy the tensor cores; inside each, S_{j+1} =
  Q·K_{j+1}ᵀ and O += P_j·V_j are in flight while softmax_{j+1} runs (P from registers).
- Base-2 online softmax with the score scale · log2(e) folded into one multiply; causal rows
  visit their unmasked blocks without mask code, then the diagonal block masked.
- O leaves through shared memory (the Q tile's) and a TMA store.
"""

# Gluon kernels are a DSL that Triton traces (constexpr arguments, layouts as values), not
# Python that a static type checker can follow; pyright skips this file.

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# fmt: off
_GL_BLOCK = 128
_GL_LOG2E = 1.4426950408889634


@gluon.jit
def _gl_tile(N, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """This program's batch*head, Q tile (heaviest first), first Q and K/V rows in the
    flattened [rows, D] views, and KV block counts: blocks [0, n_full) need no mask, blocks
    [n_full, n_total) straddle the causal diagonal."""
    off_hz = gl.program_id(0)
    pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
    q_row0 = off_hz * N + pid_m * BLOCK_M
    kv_row0 = (off_hz // GROUP) * N
    if CAUSAL:
        n_full = (pid_m * BLOCK_M) // BLOCK_N
        n_total = ((pid_m + 1) * BLOCK_M) // BLOCK_N
    else:
        n_full = N // BLOCK_N
        n_total = n_full
    return off_hz, pid_m, q_row0, kv_row0, n_full, n_total


@gluon.jit
def _gl_softmax(s, m_i, l_i, qk_scale, q_pos, k_pos, MASKED: gl.constexpr):
    """One raw score block's base-2 online softmax step: P (unnormalised), the output's
    rescale factor, the new running max (scaled, base 2) and row sum."""
    if MASKED:
        s = gl.where(q_pos[:, None] >= k_pos[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _gl_take_turn(turn_bars, event, WG: gl.constexpr):
    """Ping-pong: a consumer's wgmma issue number `event` waits until the other consumer
    has issued its previous one."""
    mbarrier.wait(turn_bars.index(WG), (event & 1) ^ (1 - WG))


@gluon.jit
def _gl_pass_turn(turn_bars, WG: gl.constexpr):
    """Ping-pong: the other consumer may issue its wgmmas now."""
    mbarrier.arrive(turn_bars.index(1 - WG), count=1)


@gluon.jit
def _gl_blocks(descs, bufs, q_tile, acc, m_i, l_i, p_op, qk_scale, q_pos, lo, hi,
               MASKED: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr):
    """KV blocks [lo, hi). On entry `p_op` holds P of block lo-1, not yet multiplied by its V.
    Per block j: issue S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1}, wait for S_j only, softmax_j,
    then wait for the P·V, release slot j-1 and rescale O."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    s_layout: gl.constexpr = q_pos.type.layout.parent
    s_zero = gl.zeros([q_pos.shape[0], BLOCK_N], gl.float32, s_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for j in range(lo, hi):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        _gl_take_turn(turn_bars, j, WG)
        s = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        _gl_pass_turn(turn_bars, WG)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p, alpha, m_i, l_i = _gl_softmax(s, m_i, l_i, qk_scale, q_pos, j * BLOCK_N + cols, MASKED)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        gl.thread_barrier()
        mbarrier.arrive(empty_bars.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        p_op = gl.convert_layout(p.to(k_desc.dtype), p_op.type.layout)
    return acc, m_i, l_i, p_op


@gluon.jit
def _gl_consumer(descs, bufs, lse_ptr, qk_scale, N, GROUP,
                 CAUSAL: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr):
    """The 64 rows of the Q tile that consumer WG owns: block 0 (masked when causal, harmless
    on a full block), the unmasked blocks, the diagonal blocks, the last P·V, the epilogue
    (O = acc / l through shared memory and a TMA store; lse = (m + log2 l)·ln 2)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    ROWS: gl.constexpr = o_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    ROW0: gl.constexpr = ROWS * WG
    warps: gl.constexpr = [gl.num_warps(), 1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    off_hz, pid_m, q_row0, kv_row0, n_full, n_total = _gl_tile(N, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
    q_tile = q_smem.slice(ROW0, ROWS)
    q_pos = pid_m * BLOCK_M + ROW0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, HEAD_D], gl.float32, o_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    _gl_take_turn(turn_bars, 0, WG)
    s = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _gl_pass_turn(turn_bars, WG)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = _gl_softmax(s, m_i, l_i, qk_scale, q_pos, cols, CAUSAL)
    p_op = gl.convert_layout(p.to(q_desc.dtype), p_layout)
    acc, m_i, l_i, p_op = _gl_blocks(descs, bufs, q_tile, acc, m_i, l_i, p_op, qk_scale, q_pos, 1, n_full,
                                     False, STAGES, WG)
    if CAUSAL:
        acc, m_i, l_i, p_op = _gl_blocks(descs, bufs, q_tile, acc, m_i, l_i, p_op, qk_scale, q_pos,
                                         gl.maximum(n_full, 1), n_total, True, STAGES, WG)
    last = n_total - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    _gl_take_turn(turn_bars, n_total, WG)
    acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
    _gl_pass_turn(turn_bars, WG)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    q_tile.store((acc / l_o[:, None]).to(o_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row0 + ROW0, 0], q_tile)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    gl.store(lse_ptr + off_hz * N + pid_m * BLOCK_M + ROW0 + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453)
    tma.store_wait(pendings=0)


@gluon.jit
def _gl_producer(descs, bufs, N, GROUP, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """The load partition: Q once, then K/V block j into slot j % STAGES once both consumers
    released the block that used the slot before (the first STAGES waits pass at once)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars = bufs
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    off_hz, pid_m, q_row0, kv_row0, n_full, n_total = _gl_tile(N, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, 0], q_bar, q_smem)
    for j in range(n_total):
        slot = j % STAGES
        mbarrier.wait(empty_bars.index(slot), ((j // STAGES) & 1) ^ 1)
        row = kv_row0 + j * BLOCK_N
        mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, 0], k_bars.index(slot), k_smem.index(slot))
        mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, 0], v_bars.index(slot), v_smem.index(slot))


@gluon.jit
def attn_fwd_sm90(q_desc, k_desc, v_desc, o_desc, lse_ptr, qk_scale, N, GROUP,
                  CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """out, lse of one 128-row Q tile: a TMA producer warp and two ping-pong consumer
    warpgroups sharing a STAGES-deep K/V ring (see the module docstring). num_warps=4."""
    descs = (q_desc, k_desc, v_desc, o_desc)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    fence_async_shared()
    bufs = (q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars)
    gl.warp_specialize(
        [
            (_gl_consumer, (descs, bufs, lse_ptr, qk_scale, N, GROUP, CAUSAL, STAGES, 0)),
            (_gl_consumer, (descs, bufs, lse_ptr, qk_scale, N, GROUP, CAUSAL, STAGES, 1)),
            (_gl_producer, (descs, bufs, N, GROUP, CAUSAL, STAGES)),
        ],
        [4, 1],
        [240, 24],
    )


_GL_BINARIES = {}


@functools.cache
def _gl_layouts(head_d, dtype):
    """The NVMMA shared layouts of the Q tile, a K/V block and a consumer's O box."""
    dt = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return (gl.NVMMASharedLayout.get_default_for([_GL_BLOCK, head_d], dt),
            gl.NVMMASharedLayout.get_default_for([_GL_BLOCK, head_d], dt),
            gl.NVMMASharedLayout.get_default_for([_GL_BLOCK // 2, head_d], dt))


def _gluon_fits(q, k, v, min_len):
    """Whether this call can take the Gluon kernel: Nq = Nk, a multiple of 128 and at least
    min_len (below it the generic kernel's cheaper launch wins), and 16-byte aligned data
    (TMA). The compiler checked dtypes, head dims and the variant itself."""
    n = q.shape[2]
    return (n == k.shape[2] and n >= min_len and n % _GL_BLOCK == 0
            and q.data_ptr() % 16 == 0 and k.data_ptr() % 16 == 0 and v.data_ptr() % 16 == 0)


def _gluon_attention(q, k, v, out, lse, qk_scale, causal):
    """out[B, Hq, N, D] and lse (a contiguous fp32 buffer of at least B*Hq*N elements) of
    softmax(q·kᵀ·qk_scale [causal]) v by `attn_fwd_sm90`; qk_scale is the score scale, and
    q and k hold their transforms. Non-contiguous q, k or v are copied first (TMA reads
    them as [rows, D] views)."""
    q, k, v = (x if x.is_contiguous() else x.contiguous() for x in (q, k, v))
    b, hq, n, d = q.shape
    q_layout, kv_layout, o_layout = _gl_layouts(d, q.dtype)

    def desc(t, rows, layout):
        flat = t.view(-1, d)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, d], layout)

    group = hq // k.shape[1]
    grid = (b * hq, n // _GL_BLOCK, 1)  # three entries: a compiled binary's launcher indexes all three
    args = (desc(q, _GL_BLOCK, q_layout), desc(k, _GL_BLOCK, kv_layout), desc(v, _GL_BLOCK, kv_layout),
            desc(out, _GL_BLOCK // 2, o_layout), lse, qk_scale * _GL_LOG2E, n, group)
    # What Triton specialises the binary on (N is a multiple of 128, so always divisible by 16).
    key = (q.device.index, q.dtype, d, causal, group == 1, group % 16 == 0, lse.data_ptr() % 16 == 0)
    binary = _GL_BINARIES.get(key)
    if binary is None:  # Triton's launch path: compiles or loads the binary
        _GL_BINARIES[key] = attn_fwd_sm90[grid](*args, CAUSAL=causal, STAGES=3, num_warps=4)
    else:  # the binary directly, without Triton's per-call argument binding
        binary[grid](*args, causal, 3)
    return out
