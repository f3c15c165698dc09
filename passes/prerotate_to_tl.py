"""The pre-rotation kernels of convert-attn-to-tl (`rotate_k`, the backward's and the Gluon
forward's `rotate_q`): Q's or K's transforms applied once, into a transformed copy that the
attention kernels read (`q_rot`, `k_rot`), where a kernel cannot apply them itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import i32, i64
from xdsl.ir import SSAValue

from attnfuse.dialects import tl
from attnfuse.passes.launcher_to_tl import KernelCall
from attnfuse.passes.tl_builder import KernelBuilder, Params

if TYPE_CHECKING:
    from attnfuse.passes.kernel_lowering import KernelLowering


@dataclass(frozen=True)
class PrerotateConfig:
    """Launch shape of the pre-rotation kernels (`rotate_k`, the backward's `rotate_q`): a
    streaming copy of `block_n` rows per program, so a few warps and no software pipelining.
    32 rows: on the H200 the Llama shape's rotate_q took 21 µs instead of 28 at N = 4096 (64
    rows, 4 warps) and 82 instead of 106 at 16384; 8 or 16 warps, or 128 rows, did no better
    (benchmarks/NOTES.md, 2026-12-04)."""

    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 1


PREROTATE = PrerotateConfig()


def rotate_kernel(kl: KernelLowering, which: str = "k") -> KernelCall:
    """`rotate_k` (or `rotate_q`): apply K's (Q's) transforms once, writing a
    transformed copy `k_rot` (`q_rot`)."""
    p = Params()
    kb = KernelBuilder(p, p.block)
    chains = kl.chains
    is_q = which == "q"
    arg, chain = (chains.q_arg, chains.q_chain) if is_q else (chains.k_arg, chains.k_chain)
    heads, dtype = (kl.hq, kl.dtype) if is_q else (kl.hkv, kl.kdtype)
    x = kl.tensor(p, arg)
    rot_ptr = p.param(f"{which.upper()}_rot", tl.PointerType(dtype), f"{which}_rot")
    rot_strides = [p.param(f"stride_{which}r_{d}", i32, f"{which}_rot.stride({d})") for d in range(4)]
    name = kl.host_name(arg)
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
    pos = kl.row_positions(kb, p, which, offs_n, n)

    def base_of(ptr: SSAValue, strides: list[SSAValue], hint: str) -> SSAValue:
        """The tile's first row: batch, head and row offsets in int64."""
        bh = kb.add(kb.add(ptr, kb.mul(b_off, strides[0])), kb.mul(h_off, strides[1]))
        return kb.add(bh, kb.mul(n_off, strides[2]), hint=hint)

    base = base_of(x.ptr, x.strides, f"{which}_base")
    pos = kl.positions(kb, p, chain, pos, b_off, offs_n, ok)
    x_t = kl.qk.transformed(
        kb,
        p,
        chain,
        lambda chans: kl.qk.load_tile(kb, base, rows, ok, x.strides[2], x.strides[3], chans, True, which),
        pos,
        ok,
        True,
        which,
        signed_pos=is_q,
    )
    offs_d = kb.arange(kl.dpad, hint="offs_d")
    out_base = base_of(rot_ptr, rot_strides, f"{which}_rot_base")
    ptr = kb.add(
        kb.add(out_base, kb.mul(kb.row(rows), rot_strides[2])),
        kb.mul(kb.col(offs_d), rot_strides[3]),
        hint=f"{which}_rot_ptr",
    )
    mask = kb.row(ok)
    if kl.dpad != kl.d:
        mask = kb.and_(mask, kb.col(kb.cmp("<", offs_d, kl.d)))
    kb.store(ptr, kb.cast(x_t, dtype), mask)
    p.block.add_op(tl.ReturnOp())
    grid = [f"_cdiv({name}.shape[2], {PREROTATE.block_n})", f"{name}.shape[0] * {heads}"]
    return KernelCall(kl.kernel(f"rotate_{which}", p), p, grid, PREROTATE.num_warps, PREROTATE.num_stages)
