"""convert-attn-to-tl's Gluon backward (kernel path `gluon-sm90` on a backward function): the
generic backward's kernels, plus what the sm90 Gluon backward kernel
(`attnfuse/targets/triton/gluon_bwd_sm90.py`) needs, and a launcher that chooses per call.

- The variant's score ops and their derivatives as `tl.device_fn`s the Gluon kernel calls (its
  hooks): the query blocks a block of keys meets (`gluon_bwd_range`, causal-split's bounds
  transposed, as `q_segments` gives the generic dK/dV kernel's loop) and P and dS of unmasked
  and masked blocks (`gluon_bwd_full`, `gluon_bwd_masked`): P recomputed from the raw fp32
  product and the saved log-sum-exp, dS = P (dP - delta) back through the score ops'
  derivatives, the same arithmetic as the generic kernels' (`BackwardLowering.probs`,
  `score_grad`).
- `attn_bwd_dq_acc`: dQ from the Gluon kernel's fp32 workspace, scaled, Q's chain's derivatives
  applied (inverse RoPE, RMSNorm backward, a norm weight's gradient share); `attn_bwd_dk_acc`
  the same for K when K has a chain other than one RoPE of the `half` style over every channel
  (the Gluon kernel writes dK itself, through that RoPE's derivative when K has it; at the
  head dims of `APPLY_K_ROPE_HEAD_DIMS` it also applies the RoPE, to k as given, so that
  `rotate_k` and its `k_rot` are the generic kernels' only).
- The launcher: `if _gluon_bwd_fits(...)`: the Gluon kernels (with kernel-path's `dq-reduce`, the
  default, dQ's TMA reduce-adds from the dK/dV kernel unless `torch.use_deterministic_algorithms`
  is on; else the dK/dV kernel, then the ordered dQ kernel), then the workspaces' kernels; else the generic
  dK/dV and dQ kernels.
"""

from __future__ import annotations

from xdsl.dialects.builtin import f32, i32, i64
from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.backward_epilogues_to_tl import store_gradient
from attnfuse.passes.backward_to_tl import BackwardLowering, Side
from attnfuse.passes.kernel_path import GLUON_BWD_BLOCK, kernel_path, reduces_dq, rotates_halves
from attnfuse.passes.kv_segments import kv_segments, q_segments
from attnfuse.passes.launcher_to_tl import KernelCall, LoweredFunction, call_op, device_fn_op
from attnfuse.passes.tl_builder import KernelBuilder, Params

APPLY_K_ROPE_HEAD_DIMS = (64,)
"""Head dims at which the dK/dV kernel applies K's RoPE itself (`tl.gluon_backward ... apply_k_rope`),
its consumers rotating their keys in shared memory; at the others the pre-rotation kernel `rotate_k`
rotates K and the kernel only takes dK back through the RoPE. H200, RoPE + causal: at head dim 64
(paper shape) the dK/dV kernel was 13-14 µs faster at N = 4096 with the rotation in it, and
rotate_k's 16 µs went; at 128 (Llama) the kernel was 17-21 µs slower at 4096, about what rotate_k (7
µs) and its k_rot saved (benchmarks/NOTES.md, 2026-12-04, fifteenth session)."""


class GluonBackwardLowering(BackwardLowering):
    """Builds the kernels, the Gluon kernel's functions and the launcher of one backward
    function kernel-path gave the sm90 Gluon kernel."""

    def __init__(self, chains: AttentionChains, arg_names: list[str]):
        super().__init__(chains, arg_names)
        self.xargs: list[str] = []
        """Host expressions for the P/dS functions' extra arguments (`hooks` sets them)."""
        if not (self.need_dq and self.need_dk and self.need_dv):
            raise DiagnosticException(
                f"func @{chains.func.sym_name.data}: the Gluon backward computes dq, dk and dv together; "
                "kernel-path gives it only functions that ask for all three"
            )

    def lower(self) -> LoweredFunction:
        calls = self.kernels()
        fns = self.hooks()
        extra = [self.acc_kernel(self.q)]
        k_rope = self.k_rope()
        if self.k.grads and k_rope is None:
            extra.append(self.acc_kernel(self.k))
        apply_k_rope = k_rope is not None and self.d in APPLY_K_ROPE_HEAD_DIMS
        launcher = self.gluon_launcher(calls, fns, extra, k_rope, apply_k_rope)
        kernels = [c.kernel for c in calls + extra]
        return self.lowered(kernels, launcher, fns)

    def k_rope(self) -> tuple[str, str, str] | None:
        """K's chain when the dK/dV kernel applies it and its derivative itself: one RoPE of
        the `half` style over every channel (`rotates_halves`, as the forward's kernel rotates
        Q); its cos and sin tables' host names and their rows per sequence (0: by position).
        None otherwise: K is pre-rotated and dK goes through `attn_bwd_dk_acc`."""
        chain = self.chains.k_chain
        if len(chain) != 1 or not isinstance(op := chain[0], attn.RopeOp) or not rotates_halves(op, self.d):
            return None
        return self.rope_tables(op)

    # ------------------------------------------------------------------ the hooks
    def hooks(self) -> list[tl.DeviceFnOp]:
        """gluon_bwd_range, gluon_bwd_kv_range, gluon_bwd_full and gluon_bwd_masked (the last two
        with the same extra parameters)."""
        masked, params = self.block_fn("gluon_bwd_masked", True, None)
        full, _ = self.block_fn("gluon_bwd_full", False, params)
        self.xargs = params.host[7:]
        return [self.range_fn(), self.kv_range_fn(), full, masked]

    def range_fn(self) -> tl.DeviceFnOp:
        """`gluon_bwd_range(k_lo, k_hi, NQ)`: the query rows some query of which keeps a key
        of positions [k_lo, k_hi], [lo, hi), and those whose every query keeps all of them,
        [full_lo, full_hi), in blocks of the Gluon kernel's query rows (Nq = Nk)."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        k_lo, k_hi, nq = (p.param(n, i32, "") for n in ("k_lo", "k_hi", "NQ"))
        segments = q_segments(kb, self.kv_bounds, k_lo, k_hi, kb.value(0), nq, GLUON_BWD_BLOCK)
        if len(segments) == 3:
            lo, f_lo, f_hi, hi = segments[0][0], segments[1][0], segments[1][1], segments[2][1]
        else:
            ((lo, hi, masked),) = segments
            f_lo, f_hi = (hi, hi) if masked else (lo, hi)
        p.block.add_op(tl.ReturnOp(lo, f_lo, f_hi, hi))
        return device_fn_op("gluon_bwd_range", p)

    def kv_range_fn(self) -> tl.DeviceFnOp:
        """`gluon_bwd_kv_range(q_lo, q_hi, NK)`: the keys some query of positions [q_lo, q_hi]
        keeps, [lo, hi), and those all of them keep, [full_lo, full_hi), in blocks of the dQ
        kernel's keys (causal-split's bounds, as `kv_segments` gives the generic loops)."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        q_lo, q_hi, nk = (p.param(n, i32, "") for n in ("q_lo", "q_hi", "NK"))
        segments = kv_segments(kb, self.kv_bounds, q_lo, q_hi, nk, GLUON_BWD_BLOCK)
        lo, hi = segments[0][0], segments[-1][1]
        f_lo, f_hi = (segments[1][0], segments[1][1]) if len(segments) == 3 else (hi, hi)
        p.block.add_op(tl.ReturnOp(lo, f_lo, f_hi, hi))
        return device_fn_op("gluon_bwd_kv_range", p)

    def block_fn(self, name: str, masked: bool, like: Params | None) -> tuple[tl.DeviceFnOp, Params]:
        """`name(s, dp, lse2, delta, q_idx, kv_idx, off_hz, *extras) -> (p, ds)` on a
        transposed block (keys along rows): s = K Qᵀ and dp = V dOᵀ (fp32), lse2 the queries'
        log-sum-exp in base 2 and delta theirs, q_idx [1, M] and kv_idx [N, 1] positions, of
        query head `off_hz` (batch*head). The masks are applied when `masked`. delta enters only
        as dp - delta, so a kernel may pass dp - delta and 0.0 (the dK/dV kernel does at head dim
        128, `FOLD_DELTA`)."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        s = p.param("s", tl.TileType(f32), "")
        dp = p.param("dp", tl.TileType(f32), "")
        lse2 = p.param("lse2", tl.TileType(f32), "")
        delta = p.param("delta", tl.TileType(f32), "")
        q_idx = p.param("q_idx", tl.TileType(i32), "")
        kv_idx = p.param("kv_idx", tl.TileType(i32), "")
        off_hz = p.param("off_hz", i32, "")
        ctx = self.hook_ctx(kb, p, q_idx, kv_idx, off_hz, masked, like)
        env: dict[SSAValue, SSAValue] = {}
        scores = self.score_ops(kb, p, self.scores(kb, s), ctx, masked, env)
        pr, dropped = self.probs(kb, scores, lse2, masked)
        ds = self.score_grad(kb, p, pr, dp, delta, env, ctx, dropped)
        if like is not None and len(p.host) != len(like.host):
            raise DiagnosticException(f"{name} reads a tensor the masked function does not")
        p.block.add_op(tl.ReturnOp(pr, ds))
        return device_fn_op(name, p), p

    # ------------------------------------------------------------------ the workspaces' kernels
    def acc_kernel(self, side: Side) -> KernelCall:
        """`attn_bwd_dq_acc` / `attn_bwd_dk_acc`: a gradient from the Gluon kernel's fp32
        workspace, times the scores' scale for dQ (the kernel scaled dK), through the side's
        chain's derivatives, stored in the gradient's dtype. Its grid and program numbering are
        the generic dQ (dK/dV) kernel's, so a norm weight's gradient shares fill the same
        buffer."""
        is_q = side is self.q
        which = "dq" if is_q else "dk"
        p = Params()
        kb = KernelBuilder(p, p.block)
        acc = self.out_tensor(p, f"{which.upper()}_ACC", f"{which}_acc")
        heads = self.hq if is_q else self.hkv
        host = self.host_name(side.arg)
        n = p.param("N", i32, f"{host}.shape[2]")
        block = p.param("BLOCK", i32, str(self.block_m), constexpr=True)
        pid_bh = kb.emit(tl.ProgramIdOp(0 if is_q else 1), "pid_bh")
        pid_m = kb.emit(tl.ProgramIdOp(1 if is_q else 0), "pid_m")
        b = kb.floordiv(pid_bh, heads, hint="b")
        h = kb.rem(pid_bh, heads, hint="h")
        b_off, h_off = kb.cast(b, i64, hint="b_off"), kb.cast(h, i64, hint="h_off")
        m_start = kb.mul(pid_m, block, hint="m_start")
        m_off = kb.cast(m_start, i64, hint="m_off")
        rows = kb.arange(block, hint="rows")
        offs = kb.add(m_start, rows, hint="offs")
        ok = kb.cmp("<", offs, n, hint="row_ok")
        base = self.base(kb, acc, b_off, h_off)
        g = self.tile(kb, acc, base, m_off, rows, ok, self.d, which)
        tile_base = kb.add(base, kb.mul(m_off, acc.strides[2]))

        def g_at(chans: SSAValue) -> SSAValue:  # the tile again, at other channels (RoPE's pairs)
            t = self.qk.load_tile(kb, tile_base, rows, ok, acc.strides[2], acc.strides[3], chans, True, f"{which}_at")
            return kb.mul(t, self.scale) if is_q else t

        if is_q:
            g = kb.mul(g, self.scale)
            program = kb.add(kb.mul(pid_bh, kb.emit(tl.NumProgramsOp(1))), pid_m, hint="program")
        else:
            program = kb.add(kb.mul(pid_bh, kb.emit(tl.NumProgramsOp(0))), pid_m, hint="program")
        store_gradient(self, kb, p, side, g, b_off, h_off, m_off, rows, offs, offs, ok, program, which, g_at)
        p.block.add_op(tl.ReturnOp())
        blocks = f"_cdiv({host}.shape[2], {self.block_m})"
        grid = [f"{host}.shape[0] * {heads}", blocks] if is_q else [blocks, f"{host}.shape[0] * {heads}"]
        # 16 warps: a program's [128, D] fp32 tile over 512 threads (at the Llama shape on the
        # H200 the dQ one took 63.5 µs at 4 warps, 48.5 at 8, 41.8 at 16; 2026-12-03)
        return KernelCall(self.kernel(f"attn_bwd_{which}_acc", p), p, grid, 16, 1)

    # ------------------------------------------------------------------ the launcher
    def gluon_launcher(
        self,
        calls: list[KernelCall],
        fns: list[tl.DeviceFnOp],
        acc: list[KernelCall],
        k_rope: tuple[str, str, str] | None,
        apply_k_rope: bool,
    ) -> tl.LauncherOp:
        """The generic launcher (of `calls`) with its dK/dV and dQ launches replaced by `if
        _gluon_bwd_fits(...)`: the Gluon kernels (with `fns`, the `hooks`; K's RoPE tables
        `k_rope`, when the dK/dV kernel applies its derivative; with `apply_k_rope`, the RoPE too, on
        k as given) and the workspaces' kernels `acc`; else the generic ones (after K's
        pre-rotation, with `apply_k_rope`)."""
        launcher = self.backward_launcher(calls)
        ops = list(launcher.body.block.ops)
        launches = [
            op for op in ops if isinstance(op, tl.CallOp) and op.callee.data in ("attn_bwd_dkdv", "attn_bwd_dq")
        ]
        q, k, v = (self.host_name(a) for a in (self.chains.q_arg, self.chains.k_arg, self.chains.v_arg))
        q_in = "q_rot" if self.q.pre else q  # the pre-rotation kernels' outputs (`kernels`)
        k_in = "k_rot" if self.k.pre and not apply_k_rope else k
        generic: list[Operation] = []
        if apply_k_rope:  # the Gluon kernel rotates K itself: k_rot is the generic kernels'
            generic = [op for op in ops if _defines_k_rot(op)]
        then: list[Operation] = [
            tl.AllocOp(
                "dq_acc", [f"{q}.shape[0]", str(self.hq), f"{q}.shape[2]", str(self.d)], "torch.float32", f"{q}.device"
            )
        ]
        dk_out = "dk"
        if self.k.grads and k_rope is None:  # K's chain's derivatives run in attn_bwd_dk_acc, on an fp32 dK
            then.append(
                tl.AllocOp(
                    "dk_acc",
                    [f"{k}.shape[0]", str(self.hkv), f"{k}.shape[2]", str(self.d)],
                    "torch.float32",
                    f"{k}.device",
                )
            )
            dk_out = "dk_acc"
        then.append(
            tl.GluonBackwardOp(
                (q_in, k_in, v, self.host_of(1), self.host_of(2), "delta"),
                ("dq_acc", dk_out, "dv"),
                self.scale,
                [f.sym_name.data for f in fns],  # the four of `hooks`, in order
                "not _gl_deterministic()" if reduces_dq(self.chains.func) else None,
                self.xargs,
                k_rope,
                apply_k_rope,
            )
        )
        then += [call_op(c) for c in acc]
        _, min_len = kernel_path(self.chains.func)
        fits = f"_gluon_bwd_fits({q_in}, {k_in}, {v}, {self.host_of(1)}, {self.host_of(2)}, {min_len})"
        choose = tl.HostIfOp(fits, then, [op.clone() for op in generic + launches])
        first = launches[0]
        assert first.parent is not None
        first.parent.insert_op_before(choose, first)
        for op in generic + launches:
            op.detach()
            op.erase()
        return launcher


def _defines_k_rot(op: Operation) -> bool:
    """Whether a launcher op allocates or fills `k_rot`, K's pre-rotated copy."""
    return (isinstance(op, tl.AllocOp) and op.var.data == "k_rot") or (
        isinstance(op, tl.CallOp) and op.callee.data == "rotate_k"
    )
