"""Hand-written Gluon FlashAttention forward kernels for Hopper (sm90), and their driver (issue 13).

Question: can an sm90 Gluon kernel match cuDNN where AttnFuse's generated Triton kernel is 10-17% slower?
Kernel versions, each selectable, in increasing ambition:

- v1 ``tma_wgmma``: one CTA of 8 warps (two warpgroups, 64 query rows each) per 128-row Q tile. Q is loaded once by
  TMA; K/V tiles stream through a ring of STAGES shared buffers guarded by mbarriers, refilled by the same warps.
  S = Q.K^T and O += P.V are async ``warpgroup_mma``s, P fed from registers. Base-2 online softmax with
  sm_scale*log2(e) folded into one multiply; causal rows visit the unmasked blocks without mask code, then the
  diagonal block(s) masked. O leaves through shared memory and a TMA store; lse (natural log) is stored as fp32.
- v2 ``ws``: as v1, but ``gl.warp_specialize`` moves every TMA load into a 1-warp producer partition, which refills
  a slot as soon as the consumers release it through an "empty" mbarrier.
- v3 ``ws_overlap``: as v2, with FA3's intra-warpgroup overlap: S_{j+1} = Q.K_{j+1}^T and O += P_j.V_j are both in
  flight while the softmax of block j+1 runs, so the tensor cores are not idle during the exponentials.
  ``v3s2`` is v3 with a 2-deep K/V ring at D=128 (160 KB of shared memory instead of 224 KB).
- v4 ``ping-pong``: v3's consumer split into two 4-warp partitions (one warpgroup, 64 rows each) that take turns
  issuing their wgmmas (FA3's ping-pong), so one warpgroup's softmax overlaps the other's GEMMs. It is the kernel
  the compiler ships, imported from ``attnfuse/targets/triton/gluon_sm90.py`` (``attn_fwd_sm90``), as are the
  pieces all versions share (``_gl_tile``, ``_gl_softmax``).

All versions launch the heaviest causal Q tiles first (grid (B*Hq, N/128), Q tiles walked from the last).

Usage::

    python benchmarks/gluon/attention_sm90.py --compile-only            # no GPU: compile every version for sm90
    python benchmarks/gluon/attention_sm90.py --out OUT --budget-s 220  # GPU: check against SDPA, time vs cuDNN

The GPU mode runs each version in its own subprocess with a timeout (a deadlocked mbarrier must not hang the run)
and writes ``results.jsonl`` and ``results.md`` to ``--out`` as results arrive.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from attnfuse.targets.triton.gluon_sm90 import _gl_softmax, _gl_tile, attn_fwd_sm90

V4_HOOKS = dict(RANGE=None, SCORE_FULL=None, SCORE_MASKED=None, NATURAL=False, CONSUMERS=2, PINGPONG=True)
"""v4 is the compiler's kernel without the score functions of variants other than causal or none
(two consumer warpgroups taking turns, the head-dim-128 schedule)."""
V4_ABSENT = ("sink_ptr", "cos_ptr", "sin_ptr", "qn_w_ptr", "qn_eps", "fp8_scales")
"""v4's optional arguments, all None: no sink, RoPE, QK-norm or FP8."""

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------------------------------
# Shared pieces of the kernels
# ----------------------------------------------------------------------------------------------------------------------


@gluon.jit
def _tile(N, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """The compiler kernel's tile (`_gl_tile`, no hooks) as v1-v3 walk it, from block 0 with no
    peeled first block: blocks [0, n_full) unmasked, [n_full, n_total) on the causal diagonal."""
    off_hz, pid_m, j0, a, b, n_total = _gl_tile(N, BLOCK_M, BLOCK_N, CAUSAL, None)
    q_row0 = off_hz * N + pid_m * BLOCK_M  # first Q and K/V rows of the contiguous [rows, D] views
    kv_row0 = (off_hz // GROUP) * N
    if CAUSAL:
        n_full = (pid_m * BLOCK_M) // BLOCK_N
    else:
        n_full = n_total
    return off_hz, pid_m, q_row0, kv_row0, n_full, n_total


@gluon.jit
def _issue_kv(descs, bufs, kv_row0, j, pred, STAGES: gl.constexpr):
    """TMA loads of K/V block ``j`` into ring slot ``j % STAGES``; K and V have their own barriers so S = Q.K^T can
    start before V lands. ``pred`` skips the loads (past the last block)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars = bufs
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    slot = j % STAGES
    row = kv_row0 + j * BLOCK_N
    mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [row, 0], k_bars.index(slot), k_smem.index(slot), pred=pred)
    mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [row, 0], v_bars.index(slot), v_smem.index(slot), pred=pred)


@gluon.jit
def _issue_q(descs, bufs, q_row0):
    """TMA load of this program's Q tile, signalled on the Q barrier."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars = bufs
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, 0], q_bar, q_smem)


@gluon.jit
def _epilogue(acc, m_i, l_i, o_desc, o_smem, lse_ptr, lse_off, q_row0, s_layout: gl.constexpr):
    """O = acc / l through shared memory and a TMA store; lse = (m + log2 l) * ln 2 stored as fp32."""
    BLOCK_M: gl.constexpr = o_desc.block_type.shape[0]
    o_layout: gl.constexpr = acc.type.layout
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    o = acc / l_o[:, None]
    o_smem.store(o.to(o_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row0, 0], o_smem)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(lse_ptr + lse_off + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453)
    tma.store_wait(pendings=0)


@gluon.jit
def _release(descs, bufs, kv_row0, j, n_total, STAGES: gl.constexpr, WS: gl.constexpr):
    """Block ``j``'s slot is no longer read by any wgmma of this CTA. With a producer partition (``WS``) tell it so
    through the slot's "empty" barrier; without one, refill the slot with block ``j + STAGES`` here. The thread
    barrier makes both warpgroups' wgmmas finished before one thread acts."""
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars = bufs
    gl.thread_barrier()
    if WS:
        mbarrier.arrive(empty_bars.index(j % STAGES), count=1)
    else:
        _issue_kv(descs, bufs, kv_row0, j + STAGES, j + STAGES < n_total, STAGES)


# ----------------------------------------------------------------------------------------------------------------------
# The serial consumer loop (v1, v2): S_j, softmax_j, P_j.V_j, one block after the other
# ----------------------------------------------------------------------------------------------------------------------


@gluon.jit
def _serial_blocks(
    descs,
    bufs,
    acc,
    m_i,
    l_i,
    qk_scale,
    q_pos,
    kv_row0,
    lo,
    hi,
    n_total,
    MASKED: gl.constexpr,
    STAGES: gl.constexpr,
    WS: gl.constexpr,
):
    """KV blocks [lo, hi) one at a time: wait K_j, S = Q.K_j^T, softmax, wait V_j, O = O*alpha + P.V_j."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars = bufs
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    s_layout: gl.constexpr = q_pos.type.layout.parent
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    s_zero = gl.zeros([q_pos.shape[0], BLOCK_N], gl.float32, s_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for j in range(lo, hi):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(k_bars.index(slot), phase)
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _gl_softmax(s, m_i, l_i, qk_scale, q_pos, j * BLOCK_N + cols, MASKED, False)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        p_op = gl.convert_layout(p.to(k_desc.dtype), p_layout)
        mbarrier.wait(v_bars.index(slot), phase)
        acc = warpgroup_mma(p_op, v_smem.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _release(descs, bufs, kv_row0, j, n_total, STAGES, WS)
    return acc, m_i, l_i


@gluon.jit
def _serial_consumer(
    descs, bufs, lse_ptr, qk_scale, N, GROUP, CAUSAL: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr
):
    """The whole computation of one Q tile once loads are (being) issued: unmasked blocks, diagonal blocks, epilogue."""
    q_desc, k_desc, v_desc, o_desc = descs
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    # wgmma accumulator layouts of S [BM, BN] and O [BM, D] (warps along M, 16 rows each per instruction), and the
    # register-operand layout P needs as the A operand of O += P.V
    warps: gl.constexpr = [gl.num_warps(), 1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, HEAD_D, 16])
    off_hz, pid_m, q_row0, kv_row0, n_full, n_total = _tile(N, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
    q_pos = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars = bufs
    mbarrier.wait(q_bar, 0)
    acc, m_i, l_i = _serial_blocks(
        descs, bufs, acc, m_i, l_i, qk_scale, q_pos, kv_row0, 0, n_full, n_total, False, STAGES, WS
    )
    if CAUSAL:
        acc, m_i, l_i = _serial_blocks(
            descs, bufs, acc, m_i, l_i, qk_scale, q_pos, kv_row0, n_full, n_total, n_total, True, STAGES, WS
        )
    _epilogue(acc, m_i, l_i, o_desc, q_smem, lse_ptr, off_hz * N + pid_m * BLOCK_M, q_row0, s_layout)


@gluon.jit
def _alloc(q_desc, k_desc, STAGES: gl.constexpr):
    """Shared buffers: the Q tile (reused for the O tile), K and V rings, the Q/K/V-ready barriers (one arrival: the
    expect-tx of a TMA) and the slot-empty barriers (one release by the consumer)."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=1)
    fence_async_shared()
    return (q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars)


@gluon.jit
def attn_fwd_v1(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, qk_scale, N, GROUP, CAUSAL: gl.constexpr, STAGES: gl.constexpr
):
    """v1: TMA ring + async wgmma, no warp specialization (the computing warps also issue the loads)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    descs = (q_desc, k_desc, v_desc, o_desc)
    bufs = _alloc(q_desc, k_desc, STAGES)
    off_hz, pid_m, q_row0, kv_row0, n_full, n_total = _tile(N, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
    _issue_q(descs, bufs, q_row0)
    for j in gl.static_range(STAGES):
        _issue_kv(descs, bufs, kv_row0, j, j < n_total, STAGES)
    _serial_consumer(descs, bufs, lse_ptr, qk_scale, N, GROUP, CAUSAL, STAGES, False)


# ----------------------------------------------------------------------------------------------------------------------
# Warp specialization (v2, v3): a 1-warp TMA producer partition
# ----------------------------------------------------------------------------------------------------------------------


@gluon.jit
def _producer(descs, bufs, N, GROUP, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """The load partition: Q once, then K/V block j into slot j % STAGES once the consumers released the block
    that used the slot before (parity trick: the first STAGES waits pass at once)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars = bufs
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    off_hz, pid_m, q_row0, kv_row0, n_full, n_total = _tile(N, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
    _issue_q(descs, bufs, q_row0)
    for j in range(n_total):
        mbarrier.wait(empty_bars.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
        _issue_kv(descs, bufs, kv_row0, j, True, STAGES)


@gluon.jit
def attn_fwd_v2(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, qk_scale, N, GROUP, CAUSAL: gl.constexpr, STAGES: gl.constexpr
):
    """v2: the serial consumer of v1 in the default partition, all TMA loads in a 1-warp producer partition
    (given 24 registers; the consumers get the rest)."""
    descs = (q_desc, k_desc, v_desc, o_desc)
    bufs = _alloc(q_desc, k_desc, STAGES)
    gl.warp_specialize(
        [
            (_serial_consumer, (descs, bufs, lse_ptr, qk_scale, N, GROUP, CAUSAL, STAGES, True)),
            (_producer, (descs, bufs, N, GROUP, CAUSAL, STAGES)),
        ],
        [1],
        [24],
    )


# ----------------------------------------------------------------------------------------------------------------------
# Intra-warpgroup overlap (v3): softmax of block j+1 runs while P_j.V_j is on the tensor cores
# ----------------------------------------------------------------------------------------------------------------------


@gluon.jit
def _overlap_blocks(
    descs,
    bufs,
    q_tile,
    acc,
    m_i,
    l_i,
    p_op,
    qk_scale,
    q_pos,
    lo,
    hi,
    MASKED: gl.constexpr,
    STAGES: gl.constexpr,
):
    """KV blocks [lo, hi). On entry ``p_op`` holds P of block lo-1 (acc already rescaled for it), not yet multiplied
    by V_{lo-1}. Per block j: issue S_j = Q.K_j^T, issue O += P_{j-1}.V_{j-1}, wait for S_j only, softmax_j, then
    wait for the P.V, release slot j-1 and rescale O. Returns the same state for block hi-1."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars = bufs
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    s_layout: gl.constexpr = q_pos.type.layout.parent
    s_zero = gl.zeros([q_pos.shape[0], BLOCK_N], gl.float32, s_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for j in range(lo, hi):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        s = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p, alpha, m_i, l_i = _gl_softmax(s, m_i, l_i, qk_scale, q_pos, j * BLOCK_N + cols, MASKED, False)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        gl.thread_barrier()
        mbarrier.arrive(empty_bars.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        p_op = gl.convert_layout(p.to(k_desc.dtype), p_op.type.layout)
    return acc, m_i, l_i, p_op


@gluon.jit
def _overlap_consumer(descs, bufs, lse_ptr, qk_scale, N, GROUP, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """One Q tile with the S/P.V software pipeline: block 0 (masked when causal: harmless on a full block), the
    unmasked blocks, the diagonal blocks, then the last P.V and the epilogue."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars = bufs
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    # wgmma accumulator layouts of S [BM, BN] and O [BM, D] (warps along M, 16 rows each per instruction), and
    # the register-operand layout P needs as the A operand of O += P.V
    warps: gl.constexpr = [gl.num_warps(), 1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], warps, instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    off_hz, pid_m, q_row0, kv_row0, n_full, n_total = _tile(N, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
    q_tile = q_smem
    q_pos = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = _gl_softmax(s, m_i, l_i, qk_scale, q_pos, cols, CAUSAL, False)
    p_op = gl.convert_layout(p.to(q_desc.dtype), p_layout)

    lo_masked = gl.maximum(n_full, 1)
    acc, m_i, l_i, p_op = _overlap_blocks(
        descs, bufs, q_tile, acc, m_i, l_i, p_op, qk_scale, q_pos, 1, n_full, False, STAGES
    )
    if CAUSAL:
        acc, m_i, l_i, p_op = _overlap_blocks(
            descs, bufs, q_tile, acc, m_i, l_i, p_op, qk_scale, q_pos, lo_masked, n_total, True, STAGES
        )
    last = n_total - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _epilogue(acc, m_i, l_i, o_desc, q_tile, lse_ptr, off_hz * N + pid_m * BLOCK_M, q_row0, s_layout)


@gluon.jit
def attn_fwd_v3(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, qk_scale, N, GROUP, CAUSAL: gl.constexpr, STAGES: gl.constexpr
):
    """v3: v2's 1-warp producer partition feeding the overlapped (S_{j+1} / P_j.V_j) consumer."""
    descs = (q_desc, k_desc, v_desc, o_desc)
    bufs = _alloc(q_desc, k_desc, STAGES)
    gl.warp_specialize(
        [
            (_overlap_consumer, (descs, bufs, lse_ptr, qk_scale, N, GROUP, CAUSAL, STAGES)),
            (_producer, (descs, bufs, N, GROUP, CAUSAL, STAGES)),
        ],
        [1],
        [24],
    )


# ----------------------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Version:
    """A kernel version and its launch configuration."""

    name: str
    kernel: object
    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    stages_d128: int = 3
    consumers: int = 1  # consumer partitions, each owning block_m // consumers rows (the O store box)

    def stages(self, head_d: int) -> int:
        """K/V ring depth: Q + 3 x (K, V) is 224 KB at D=128 (the limit is 227 KB), 112 KB at D=64."""
        return self.stages_d128 if head_d == 128 else 3


VERSIONS = {
    "v1": Version("v1", attn_fwd_v1),
    "v2": Version("v2", attn_fwd_v2),
    "v3": Version("v3", attn_fwd_v3),
    "v3s2": Version("v3s2", attn_fwd_v3, stages_d128=2),  # v3 with a 2-deep ring at D=128 (160 KB)
    "v4": Version("v4", attn_fwd_sm90, num_warps=4, consumers=2),  # what the compiler ships
    # v4 with 128 rows per consumer warpgroup and 64-key blocks (head dim 64's candidate)
    "v4m256n64": Version("v4m256n64", attn_fwd_sm90, block_m=256, block_n=64, num_warps=4, consumers=2),
    "v4m128n64": Version("v4m128n64", attn_fwd_sm90, block_m=128, block_n=64, num_warps=4, consumers=2),
}

SHAPES = {  # name: (B, Hq, Hkv, D, dtype name)
    "llama3-8b": (1, 32, 8, 128, "bfloat16"),
    "paper": (4, 12, 12, 64, "float16"),
}
SEQ_LENS = (2048, 4096, 8192, 16384)


def _gl_dtype(name: str):
    return {"bfloat16": gl.bfloat16, "float16": gl.float16}[name]


def _layouts(ver: Version, head_d: int, dtype_name: str):
    dt = _gl_dtype(dtype_name)
    q_layout = gl.NVMMASharedLayout.get_default_for([ver.block_m, head_d], dt)
    kv_layout = gl.NVMMASharedLayout.get_default_for([ver.block_n, head_d], dt)
    o_layout = gl.NVMMASharedLayout.get_default_for([ver.block_m // ver.consumers, head_d], dt)
    return q_layout, kv_layout, o_layout


def prepare(q, k, v, causal: bool, sm_scale: float, version: str = "v3"):
    """Allocate out [B, Hq, N, D] and lse [B, Hq, N] (natural log, fp32) of softmax(q.k^T * sm_scale) v with GQA,
    build the TMA descriptors, and return (launch, out, lse): ``launch()`` runs the kernel and nothing else."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    ver = VERSIONS[version]
    B, Hq, N, D = q.shape
    Hkv = k.shape[1]
    assert N % ver.block_m == 0 and N % ver.block_n == 0, "N must be a multiple of the tile sizes"
    assert D in (64, 128) and Hq % Hkv == 0 and k.shape == v.shape == (B, Hkv, N, D)
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert q.dtype in (torch.bfloat16, torch.float16) and k.dtype == v.dtype == q.dtype
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, N), dtype=torch.float32, device=q.device)
    q_layout, kv_layout, o_layout = _layouts(ver, D, str(q.dtype).removeprefix("torch."))

    def desc(t, rows, layout):
        flat = t.view(-1, D)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, D], layout)

    args = (
        desc(q, ver.block_m, q_layout),
        desc(k, ver.block_n, kv_layout),
        desc(v, ver.block_n, kv_layout),
        desc(out, ver.block_m // ver.consumers, o_layout),
        lse,
        sm_scale * LOG2E,
        N,
        Hq // Hkv,
    )
    grid = (B * Hq, N // ver.block_m)
    hooks = {}
    if ver.kernel is attn_fwd_sm90:  # the compiler's kernel: no sink or RoPE, both scales, its head count, no hooks
        # Its Q descriptor's box is one consumer's 64 rows (the O box).
        q_desc = desc(q, ver.block_m // ver.consumers, o_layout)
        args = (q_desc, *args[1:5], None, None, None, 0, None, None, sm_scale, sm_scale * LOG2E, None, N, Hq // Hkv, Hq)
        args = (*args, ())
        hooks = V4_HOOKS

    def launch():
        ver.kernel[grid](*args, CAUSAL=causal, STAGES=ver.stages(D), num_warps=ver.num_warps, **hooks)

    return launch, out, lse


def attention(q, k, v, causal: bool, sm_scale: float, version: str = "v3"):
    """out, lse of one attention forward with the given kernel version (see ``prepare``)."""
    launch, out, lse = prepare(q, k, v, causal, sm_scale, version)
    launch()
    return out, lse


# ----------------------------------------------------------------------------------------------------------------------
# --compile-only: sm90 compilation without a GPU
# ----------------------------------------------------------------------------------------------------------------------


def _ptxas_stats(ptx: str) -> str:
    """Registers and spills as ptxas -v reports them (triton's bundled ptxas, sm_90a)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run(
            [get_ptxas(90).path, "-v", "-arch=sm_90a", path, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
        )
    text = res.stdout + res.stderr
    regs = re.findall(r"Used (\d+) registers", text)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    spill = ", ".join(f"{s}/{l_}" for s, l_ in spills) or "?"
    text = f"regs {'/'.join(regs) or '?'} spill st/ld {spill}"
    setmaxnreg = sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)))
    if setmaxnreg:  # warp-specialized: per-partition register budgets
        text += " setmaxnreg " + " ".join(f"{op} {n}" for op, n in setmaxnreg)
    return text + ("" if res.returncode == 0 else " PTXAS FAILED")


def compile_one(ver: Version, dtype_name: str, head_d: int, causal: bool):
    """Compile one kernel version for sm90 on the host; returns the compiled kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    tdt = {"bfloat16": "bf16", "float16": "fp16"}[dtype_name]
    q_layout, kv_layout, o_layout = _layouts(ver, head_d, dtype_name)
    q_ty = f"tensordesc<{tdt}[{ver.block_m},{head_d}],{q_layout!r}>"
    kv_ty = f"tensordesc<{tdt}[{ver.block_n},{head_d}],{kv_layout!r}>"
    sig = {
        "q_desc": q_ty,
        "k_desc": kv_ty,
        "v_desc": kv_ty,
        "o_desc": f"tensordesc<{tdt}[{ver.block_m // ver.consumers},{head_d}],{o_layout!r}>",
        "lse_ptr": "*fp32",
        "qk_scale": "fp32",
        "N": "i32",
        "GROUP": "i32",
        "CAUSAL": "constexpr",
        "STAGES": "constexpr",
    }
    constexprs = {("CAUSAL",): causal, ("STAGES",): ver.stages(head_d)}
    if ver.kernel is attn_fwd_sm90:  # the compiler's kernel: no sink or RoPE, both scales, its head count, no hooks
        sig = dict(list(sig.items())[:5]) | {"q_desc": sig["o_desc"]}  # Q's box: one consumer's rows
        sig |= {name: "constexpr" for name in V4_ABSENT[:3]} | {"rope_rows": "i32"}
        sig |= {name: "constexpr" for name in V4_ABSENT[3:5]} | {"qk_scale": "fp32", "mult": "fp32"}
        sig |= {"fp8_scales": "constexpr"}
        sig |= {"N": "i32", "GROUP": "i32", "HEADS": "i32", "XARGS": (), "CAUSAL": "constexpr", "STAGES": "constexpr"}
        sig |= {name: "constexpr" for name in V4_HOOKS} | {"INNER": "constexpr"}
        constexprs |= {(name,): None for name in V4_ABSENT}
        constexprs |= {(name,): value for name, value in V4_HOOKS.items()}
        constexprs |= {("INNER",): (False,) * 4}  # contiguous q, k, v and out, as `prepare` gives them
    names = list(sig)
    src = GluonASTSource(ver.kernel, sig, constexprs={(names.index(k[0]),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": ver.num_warps})


def compile_only(versions) -> int:
    """Compile every version for every (dtype, D, causal); print shared memory, registers and spills."""
    failures = 0
    for name in versions:
        ver = VERSIONS[name]
        for dtype_name in ("bfloat16", "float16"):
            for head_d in (64, 128):
                for causal in (False, True):
                    tag = f"{name} {dtype_name:8s} D{head_d:<3d} {'causal' if causal else 'full  '}"
                    try:
                        k = compile_one(ver, dtype_name, head_d, causal)
                    except Exception as e:  # noqa: BLE001 - report and go on with the next configuration
                        failures += 1
                        print(f"{tag}: COMPILE FAILED: {str(e).splitlines()[-1] if str(e) else type(e).__name__}")
                        continue
                    smem = k.metadata.shared
                    flag = "" if smem <= 227 * 1024 else "  OVER 227 KB"
                    print(
                        f"{tag}: smem {smem / 1024:.1f} KB{flag}, warps {k.metadata.num_warps}, "
                        f"{_ptxas_stats(k.asm['ptx'])}"
                    )
    return failures


# ----------------------------------------------------------------------------------------------------------------------
# GPU mode: correctness against SDPA, timing against cuDNN and flash
# ----------------------------------------------------------------------------------------------------------------------


def _inputs(shape: str, n: int):
    B, Hq, Hkv, D, dtype_name = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(n)
    dt = getattr(torch, dtype_name)
    q, k, v = (torch.randn(B, h, n, D, device="cuda", dtype=dt, generator=gen) for h in (Hq, Hkv, Hkv))
    return q, k, v, 1.0 / math.sqrt(D)


def _reference(q, k, v, causal: bool, scale: float):
    """out (SDPA math backend, fp32) and lse (logsumexp of the fp32 scores), a few heads at a time."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, Hq, N, _ = q.shape
    group = Hq // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty((B, Hq, N), dtype=torch.float32, device=q.device)
    step = max(1, 2**31 // (N * N * 4))
    for b in range(B):
        for h0 in range(0, Hq, step):
            hs = slice(h0, min(Hq, h0 + step))
            qf = q[b, hs].float()
            kf = k[b].repeat_interleave(group, 0)[hs].float()
            vf = v[b].repeat_interleave(group, 0)[hs].float()
            s = qf @ kf.transpose(-1, -2) * scale
            if causal:
                s.masked_fill_(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            lse[b, hs] = torch.logsumexp(s, dim=-1)
            del s
            with sdpa_kernel(SDPBackend.MATH):
                out[b, hs] = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=scale)
    return out, lse


def _sdpa(backend_name: str, q, k, v, causal: bool, scale: float):
    """(fn, gqa mode) running SDPA with one backend: GQA through enable_gqa, or k/v expanded if the backend refuses."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def make(kk, vv, gqa):
        def fn():
            with sdpa_kernel(backend):
                return sdpa(q, kk, vv, is_causal=causal, scale=scale, enable_gqa=gqa)

        return fn

    fn = make(k, v, True)
    try:
        fn()
        torch.cuda.synchronize()
        return fn, "enable_gqa"
    except RuntimeError:
        group = q.shape[1] // k.shape[1]
        return make(k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), False), "expanded k/v"


def _bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _tflops(shape: str, n: int, causal: bool, ms: float) -> float:
    B, Hq, _, D, _ = SHAPES[shape]
    return 4 * B * Hq * n * n * D * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12


def _emit(out_dir: str, row: dict):
    with open(os.path.join(out_dir, "results.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def _run_version_case(version: str, shape: str, n: int, causal: bool) -> dict:
    """Check one kernel version on one case against the fp32 reference, then time it and cuDNN in this process."""
    q, k, v, scale = _inputs(shape, n)
    row = {"impl": version, "shape": shape, "N": n, "causal": causal}
    launch, out, lse = prepare(q, k, v, causal, scale, version)
    launch()
    torch.cuda.synchronize()
    ref_out, ref_lse = _reference(q, k, v, causal, scale)
    row["out_err"] = (out.float() - ref_out).abs().max().item()
    row["lse_err"] = (lse - ref_lse).abs().max().item()
    del ref_out, ref_lse
    row["status"] = "ok" if row["out_err"] <= 2e-2 and row["lse_err"] <= 2e-2 else "WRONG"
    row["ms"] = _bench(launch)
    row["tflops"] = _tflops(shape, n, causal, row["ms"])
    cudnn, row["cudnn_gqa"] = _sdpa("CUDNN_ATTENTION", q, k, v, causal, scale)
    row["cudnn_ms"] = _bench(cudnn)
    row["cudnn_over_ours"] = row["cudnn_ms"] / row["ms"]
    return row


def _run_baseline_case(impl: str, shape: str, n: int, causal: bool) -> dict:
    q, k, v, scale = _inputs(shape, n)
    backend = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}[impl]
    fn, gqa = _sdpa(backend, q, k, v, causal, scale)
    ms = _bench(fn)
    return {
        "impl": impl,
        "shape": shape,
        "N": n,
        "causal": causal,
        "status": "ok",
        "gqa": gqa,
        "ms": ms,
        "tflops": _tflops(shape, n, causal, ms),
    }


@functools.cache
def _attnfuse_variants():
    """AttnFuse's generated kernels for plain causal and non-causal attention (imported only in that worker)."""
    import attnfuse as af

    @af.variant
    def causal(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    @af.variant
    def full(q, k, v):
        return af.pv(af.softmax(af.qk(q, k)), v)

    return {True: causal, False: full}


def _run_attnfuse_case(impl: str, shape: str, n: int, causal: bool) -> dict:
    """AttnFuse's kernel on one case (its default scale is 1/sqrt(D), as here): checked, then timed with cuDNN."""
    q, k, v, scale = _inputs(shape, n)
    variant = _attnfuse_variants()[causal]
    row = {"impl": impl, "shape": shape, "N": n, "causal": causal}
    out = variant(q, k, v)
    ref_out, _ = _reference(q, k, v, causal, scale)
    row["out_err"] = (out.float() - ref_out).abs().max().item()
    row["lse_err"] = None  # the variant returns no lse
    del ref_out
    row["status"] = "ok" if row["out_err"] <= 2e-2 else "WRONG"
    row["ms"] = _bench(lambda: variant(q, k, v))
    row["tflops"] = _tflops(shape, n, causal, row["ms"])
    cudnn, row["cudnn_gqa"] = _sdpa("CUDNN_ATTENTION", q, k, v, causal, scale)
    row["cudnn_ms"] = _bench(cudnn)
    row["cudnn_over_ours"] = row["cudnn_ms"] / row["ms"]
    return row


def _cases(seq_lens):
    """Smallest N first, so a run cut short by the budget still covers every shape."""
    return [(shape, n, causal) for n in sorted(seq_lens) for shape in SHAPES for causal in (False, True)]


def worker(name: str, out_dir: str, deadline: float, seq_lens):
    """Run every case for one implementation (a kernel version, "baseline": cuDNN and flash, or "attnfuse": AttnFuse's
    generated kernel), one JSON row each."""
    impls = ["cudnn", "flash"] if name == "baseline" else [name]
    run = {"baseline": _run_baseline_case, "attnfuse": _run_attnfuse_case}.get(name, _run_version_case)
    for shape, n, causal in _cases(seq_lens):
        for impl in impls:
            if time.time() > deadline:
                print(f"[{impl}] budget exhausted, stopping", flush=True)
                return
            t0 = time.time()
            try:
                row = run(impl, shape, n, causal)
            except Exception as e:  # noqa: BLE001 - record the failure, go on with the next case
                row = {
                    "impl": impl,
                    "shape": shape,
                    "N": n,
                    "causal": causal,
                    "status": "error",
                    "error": f"{type(e).__name__}: {str(e)[:300]}",
                }
            _emit(out_dir, row)
            mode = "causal" if causal else "full"
            print(f"[{impl}] {shape} N={n} {mode}: {_describe(row)} ({time.time() - t0:.1f}s)", flush=True)
            torch.cuda.empty_cache()


def _err(value) -> str:
    return "-" if value is None else f"{value:.0e}"


def _describe(row: dict) -> str:
    if row["status"] == "error":
        return "ERROR " + row["error"]
    text = f"{row['status']} {row['ms']:.3f} ms {row['tflops']:.0f} TFLOP/s"
    if "out_err" in row:
        text += f" err out {row['out_err']:.1e} lse {_err(row['lse_err'])} cuDNN/ours {row['cudnn_over_ours']:.3f}"
    return text


def _supervise(cmd, timeout_s: float, stall_s: float) -> str:
    """Run one worker, echoing its output; kill it past ``timeout_s`` or after ``stall_s`` without a line."""
    import threading

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = [time.time()]

    def pump():
        for line in proc.stdout:
            last[0] = time.time()
            print("  " + line.rstrip(), flush=True)

    threading.Thread(target=pump, daemon=True).start()
    start = time.time()
    while proc.poll() is None:
        now = time.time()
        if now - start > timeout_s or now - last[0] > stall_s:
            proc.kill()
            proc.wait()
            return f"killed after {now - start:.0f}s ({'timeout' if now - start > timeout_s else 'no progress'})"
        time.sleep(0.5)
    return f"exit {proc.returncode} after {time.time() - start:.0f}s"


def run_all(args):
    """GPU mode: the baseline worker, then each version's worker, each in its own process, within --budget-s."""
    os.makedirs(args.out, exist_ok=True)
    open(os.path.join(args.out, "results.jsonl"), "w").close()
    end = time.time() + args.budget_s
    notes = []
    for name in ["baseline"] + args.versions.split(","):
        left = end - time.time()
        if left < 15:
            notes.append(f"{name}: skipped, budget exhausted")
            continue
        timeout = min(left, args.timeout_s)
        print(f"== {name} (timeout {timeout:.0f}s, budget left {left:.0f}s)", flush=True)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            name,
            "--out",
            args.out,
            "--deadline",
            str(time.time() + timeout - 8),
            "--seq-lens",
            args.seq_lens,
        ]
        notes.append(f"{name}: {_supervise(cmd, timeout, args.stall_s)}")
        write_markdown(args.out, notes)
    print("\n".join(notes))


def write_markdown(out_dir: str, notes):
    """results.md: per shape and causal mode, one row per N: baselines, then per version ms / TFLOP/s / cuDNN ratio."""
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "results.jsonl"))]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = ["# Gluon sm90 attention forward vs SDPA", "", "Workers: " + "; ".join(notes), ""]
    by_key = {(r["impl"], r["shape"], r["N"], r["causal"]): r for r in rows}
    for shape in SHAPES:
        for causal in (False, True):
            lines += [
                f"## {shape} {'causal' if causal else 'non-causal'} {SHAPES[shape]}",
                "",
                "| N | " + " | ".join(impls) + " |",
                "|---" * (len(impls) + 1) + "|",
            ]
            for n in sorted({r["N"] for r in rows}):
                cells = [_cell(by_key.get((impl, shape, n, causal))) for impl in impls]
                lines.append(f"| {n} | " + " | ".join(cells) + " |")
            lines.append("")
    lines.append(
        "Cells: ms, TFLOP/s; for kernel versions also cuDNN time / ours measured in the same process "
        "(>1 = faster than cuDNN) and max abs error of out / lse vs the fp32 reference."
    )
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _cell(row) -> str:
    if row is None:
        return "-"
    if row["status"] == "error":
        return "error"
    text = f"{row['ms']:.3f} ms, {row['tflops']:.0f}"
    if "out_err" in row:
        text += f", x{row['cudnn_over_ours']:.2f}, err {row['out_err']:.0e}/{_err(row['lse_err'])}"
    return ("WRONG " if row["status"] == "WRONG" else "") + text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true", help="compile every version for sm90 (no GPU needed)")
    ap.add_argument("--versions", default="v3,v4,v1,v2,attnfuse,v3s2", help="comma-separated, run in this order")
    ap.add_argument("--out", default="gluon_out", help="directory for results.jsonl and results.md")
    ap.add_argument("--budget-s", type=float, default=220.0, help="wall-clock budget of the whole GPU run")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="limit per worker process")
    ap.add_argument("--stall-s", type=float, default=30.0, help="kill a worker silent this long (a hung mbarrier)")
    ap.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)), help="comma-separated N (multiples of 128)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compile_only:
        sys.exit(1 if compile_only([v for v in args.versions.split(",") if v in VERSIONS]) else 0)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        sys.exit("attention_sm90.py runs its kernels on an sm 90 (Hopper) GPU; use --compile-only without one")
    if args.worker:
        worker(args.worker, args.out, args.deadline, [int(n) for n in args.seq_lens.split(",")])
    else:
        run_all(args)


if __name__ == "__main__":
    main()
