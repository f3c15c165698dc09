"""convert-attn-to-tl's Gluon forward (kernel path `gluon-sm90`): the generic forward's
kernels, plus what the sm90 Gluon kernel (`attnfuse/targets/triton/gluon_sm90.py`) needs, and a
launcher that chooses per call between the two.

- The variant's score ops as `tl.device_fn`s the Gluon kernel calls (its hooks): its KV
  range (`gluon_kv_range`, causal-split's bounds, as `kv_segments` gives the generic kernel's
  loop) and its scores in unmasked and masked blocks (`gluon_score`, `gluon_score_masked`);
  none when they are a causal mask or nothing, which the kernel applies itself.
- Q's transforms: applied by the kernel itself where it can (an RMSNorm, a plain RoPE:
  `kernel_path.gluon_rotates_q`), else by a pre-rotation kernel `rotate_q` before it.
- The launcher's last launch becomes `if _gluon_fits(...)`: the Gluon kernel
  (`tl.gluon_attention`), else the generic `attn_fwd` (other lengths, unaligned data).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import f32, i32
from xdsl.ir import Operation
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.dialects.attn import Placement
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.forward_to_tl import ForwardLowering
from attnfuse.passes.kernel_path import GLUON_BLOCK, gluon_rotates_q, kernel_path
from attnfuse.passes.kv_segments import kv_segments
from attnfuse.passes.launcher_to_tl import KernelCall, LoweredFunction, alloc_like, call_op, device_fn_op
from attnfuse.passes.prerotate_to_tl import rotate_kernel
from attnfuse.passes.tl_builder import KernelBuilder, Params


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
    q_rope: tuple[str, str, str] | None = None
    q_norm: tuple[str | None, float] | None = None
    """Q's RMSNorm the Gluon kernel applies (its weight's host name or None, eps); None: none."""


class GluonLowering(ForwardLowering):
    """Builds the kernels, the Gluon kernel's functions and the launcher of one forward
    function kernel-path gave the sm90 Gluon kernel."""

    def __init__(self, chains: AttentionChains, arg_names: list[str]):
        super().__init__(chains, arg_names)
        self.gluon: GluonLaunch | None = None
        """The Gluon kernel's share of the launcher (`lower` builds it)."""

    def lower(self) -> LoweredFunction:
        """The generic kernels, `rotate_q` when the Gluon kernel needs Q transformed first
        (before `attn_fwd`), the score functions and the launcher."""
        calls = self.kernel_calls()
        _, min_len = kernel_path(self.chains.func)
        q_own = self.gluon_q_transforms()
        rotate_q = rotate_kernel(self, "q") if self.chains.q_chain and q_own is None else None
        q_rope, q_norm = q_own if q_own is not None else (None, None)
        self.gluon = GluonLaunch(rotate_q, min_len, self.gluon_functions(), q_rope, q_norm)
        launcher = self.launcher(calls)
        if rotate_q is not None:
            calls.insert(-1, rotate_q)  # its kernel, defined before the main one
        functions = self.gluon.functions.ops if self.gluon.functions is not None else []
        return self.lowered([c.kernel for c in calls], launcher, functions)

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

    def gluon_q_transforms(self) -> tuple[tuple[str, str, str] | None, tuple[str | None, float] | None] | None:
        """Q's transforms as the Gluon kernel applies them itself (`kernel_path.gluon_rotates_q`):
        the launcher's cos and sin tables of its RoPE with their rows per sequence (0: by
        position) and its RMSNorm's (weight, eps), each None when absent; None when the kernel
        cannot (Q then goes through rotate_q)."""
        if not gluon_rotates_q(self.chains):
            return None
        rope, norm = None, None
        for op in self.chains.q_chain:
            if isinstance(op, attn.RopeOp):
                rope = self.rope_tables(op)
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
        return device_fn_op("gluon_kv_range", p)

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
        ctx = self.hook_ctx(kb, p, q_idx, kv_idx, off_hz, masked, like)
        out = self.score_ops(kb, p, s, ctx, masked)
        if like is not None and len(p.host) != len(like.host):
            raise DiagnosticException(f"{name} reads a tensor the masked score function does not")
        p.block.add_op(tl.ReturnOp(out))
        return device_fn_op(name, p), p

    # ------------------------------------------------------------------ the launcher
    def main_launch(self, generic: tl.CallOp) -> Operation:
        """`if _gluon_fits(...)`: Q's transforms (when it has any) by `rotate_q`, then the
        sm90 Gluon kernel on the transformed Q and K; else the generic kernel's launch."""
        gluon = self.gluon
        assert gluon is not None, "GluonLowering.lower builds the Gluon launch first"
        chains = self.chains
        q, k, v = (self.host_name(a) for a in (chains.q_arg, chains.k_arg, chains.v_arg))
        then: list[Operation] = []
        q_in = q
        if gluon.rotate_q is not None:
            c = gluon.rotate_q
            then.append(alloc_like("q_rot", q, self.hq, self.d, self.dtype))
            then.append(call_op(c))
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
