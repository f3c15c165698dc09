"""Q's and K's pre-matmul transforms (attn.rope, attn.norm, attn.scale, attn.hadamard) on tl tiles.

A q or k tile is [tokens, head dim] (or its transpose), padded to a power-of-two head
dim with masked loads; the transforms run in fp32. RoPE needs no data movement between
channels: a rotated tile is x * cos + partner(x) * sign * sin, where partner(x) is a
second load of the same rows with each channel's pair partner, taken through the same
transforms. cos and sin are read from tables: host-built [positions, rotary_dim / 2] ones for
a RoPE given by theta and scaling (`tables` lists them for the launcher), and, for a RoPE at
explicit positions or with an inv_freq operand, ones the launcher computes per call with a small
kernel (`call_tables`; one row per token of the positions tensor): no kernel computes a sine.
A Hadamard rotation is a product with its host-built [D, D] matrix
(`hadamards` lists them), to about fp32's accuracy by two float16 products (`hadamard`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import f16, f32, i32
from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.passes.tl_builder import KernelBuilder, Params, TensorParam, pow2
from attnfuse.rope_freqs import op_inv_freq

HADAMARD_MAX_D = 128
"""The largest head dim whose Hadamard rotation the kernels apply (H in float16 and a 128-row tile
split in two float16 parts take 96 KB of shared memory at 128; 256 KB at 256)."""


@dataclass(frozen=True)
class RopeLayout:
    """Which channels RoPE pairs: `half` pairs c with c + R/2, `interleaved` pairs 2i with
    2i + 1; channels from `rotary_dim` on pass through."""

    style: str
    rotary_dim: int


def rope_layout(ops: Sequence[Operation]) -> RopeLayout | None:
    """The rope layout of a q or k chain (None without an attn.rope). q's and k's may
    differ: each tile is rotated on its own before the dot."""
    ropes = [op for op in ops if isinstance(op, attn.RopeOp)]
    if len(ropes) > 1:
        raise DiagnosticException("the Triton lowering applies at most one attn.rope to q and to k")
    if not ropes:
        return None
    return RopeLayout(ropes[0].style.data.value, ropes[0].rotary_dim.value.data)


@dataclass(frozen=True)
class CallTable:
    """The cos/sin tables [rows, half] of a RoPE that the launcher computes per call (kernel
    `rope_tables`): a row per token of `positions` (row b * N + n of a [B, N] tensor) or, without
    them, per position 0..L-1; the inverse frequencies are the `inv_freq` operand's or else
    `values` (theta and scaling's), times `magnitude`."""

    positions: SSAValue | None
    inv_freq: SSAValue | None
    values: tuple[float, ...]
    magnitude: float
    half: int


@dataclass
class QKTransforms:
    """Builds the transforms of q and k tiles for the kernels of one variant."""

    d: int
    """The head dim."""
    tensor: Callable[[Params, SSAValue], TensorParam]
    """A kernel's parameter for a tensor argument of the function (norm weights, inv_freq)."""
    tables: dict[str, tuple[list[float], float]] = field(default_factory=dict)
    """The cos/sin tables the launcher builds: key -> (inv_freq, magnitude)."""
    freqs: dict[str, list[float]] = field(default_factory=dict)
    """The inverse-frequency tensors the launcher builds (what `rope_tables` kernels read)."""
    call_tables: dict[str, CallTable] = field(default_factory=dict)
    """The cos/sin tables the launcher computes per call: key -> what they are of."""
    hadamards: dict[str, int] = field(default_factory=dict)
    """The Hadamard matrices the launcher builds: key -> sign seed."""

    @property
    def dpad(self) -> int:
        """The head dim of a tile: a power of two."""
        return pow2(self.d)

    def rope_tables(self, p: Params, op: attn.RopeOp | attn.RopeGradOp) -> tuple[SSAValue, SSAValue]:
        """Pointers to the host-built [positions, rotary_dim / 2] cos and sin tables of a rope
        given by theta and scaling (no sin/cos in the kernel: it would cost more than a load)."""
        entry = op_inv_freq(op)
        key = next((k for k, e in self.tables.items() if e == entry), f"rope_{len(self.tables)}")
        self.tables[key] = entry
        return (
            p.param(f"{key}_cos", tl.PointerType(f32), f"{key}_cos"),
            p.param(f"{key}_sin", tl.PointerType(f32), f"{key}_sin"),
        )

    def freq_table(self, p: Params, values: Sequence[float]) -> SSAValue:
        """A pointer to the host-built float32 tensor of inverse frequencies `values`."""
        key = next((k for k, v in self.freqs.items() if v == list(values)), f"rope_freq_{len(self.freqs)}")
        self.freqs[key] = list(values)
        return p.param(key, tl.PointerType(f32), key)

    def call_table(self, p: Params, op: attn.RopeOp | attn.RopeGradOp) -> tuple[SSAValue, SSAValue]:
        """Pointers to the per-call cos and sin tables of a rope at explicit positions or with an
        inv_freq operand (`call_tables`)."""
        values, magnitude = ([], 1.0) if op.inv_freq is not None else op_inv_freq(op)
        entry = CallTable(op.positions, op.inv_freq, tuple(values), magnitude, op.rotary_dim.value.data // 2)
        key = next((k for k, e in self.call_tables.items() if e == entry), f"rope_at_{len(self.call_tables)}")
        self.call_tables[key] = entry
        return (
            p.param(f"{key}_cos", tl.PointerType(f32), f"{key}_cos"),
            p.param(f"{key}_sin", tl.PointerType(f32), f"{key}_sin"),
        )

    def trig_tables(self, p: Params, op: attn.RopeOp | attn.RopeGradOp) -> tuple[SSAValue, SSAValue]:
        """Pointers to the cos and sin tables a rope reads: per call (`call_table`) at explicit
        positions or with an inv_freq operand, else by position (`rope_tables`)."""
        if op.positions is not None or op.inv_freq is not None:
            return self.call_table(p, op)
        return self.rope_tables(p, op)

    def hadamard(self, kb: KernelBuilder, p: Params, op: attn.HadamardOp, x: SSAValue, tokens_first: bool) -> SSAValue:
        """x @ M for a [tokens, D] tile (Mᵀ @ x for its transpose), M = diag(signs) H / sqrt(D)
        attn.hadamard's matrix, to about fp32's accuracy: the signed tile, scaled per token by a
        power of two into [-1, 1], is split into two float16 parts (hi + lo, 22 significant
        bits) whose products with H (±1, exact in float16) add up in fp32."""
        if self.d > HADAMARD_MAX_D:
            raise DiagnosticException(
                f"attn.hadamard at head dim {self.d} has no kernel lowering (its [D, D] matrix and the split tile "
                f"exceed an SM's shared memory past D = {HADAMARD_MAX_D}); run the variant with af.backend('reference')"
            )
        seed = op.seed.value.data
        key = f"hadamard_{seed}"
        self.hadamards[key] = seed
        h_ptr = p.param(f"{key}_h", tl.PointerType(f16), f"{key}[0]")
        s_ptr = p.param(f"{key}_s", tl.PointerType(f32), f"{key}[1]")
        offs = kb.arange(self.dpad, hint="offs_h")  # D is a power of two (the verifier's rule)
        h = kb.load(kb.add(h_ptr, kb.add(kb.mul(kb.row(offs), self.d), kb.col(offs))), hint="hadamard")
        chan = kb.col if tokens_first else kb.row
        xs = kb.mul(x, chan(kb.load(kb.add(s_ptr, offs), hint="signs")), hint="x_signed")
        # A power of two at least each token's largest magnitude (2^(floor(log2 m) + 1): the cast
        # to int truncates, so the logarithm is shifted positive first).
        largest = kb.maximum(kb.reduce("max", kb.unary(tl.AbsOp, xs), 1 if tokens_first else 0), 2.0**-100)
        e = kb.sub(kb.cast(kb.add(kb.unary(tl.Log2Op, largest), 128.0), i32), 127)
        unit = kb.unary(tl.Exp2Op, kb.cast(e, f32), hint="x_unit")
        tok = kb.row if tokens_first else kb.col
        xn = kb.div(xs, tok(unit))
        hi = kb.cast(xn, f16, hint="x_hi")
        lo = kb.cast(kb.sub(xn, kb.cast(hi, f32)), f16, hint="x_lo")
        if tokens_first:
            y = kb.dot(hi, h, kb.dot(lo, h))
        else:  # H is symmetric: Mᵀ x = H diag(signs) x / sqrt(D)
            y = kb.dot(h, hi, kb.dot(h, lo))
        return kb.mul(y, tok(kb.div(unit, math.sqrt(self.d))), hint="x_rotated")

    # ------------------------------------------------------------------ pre-matmul chains
    def channels(self, kb: KernelBuilder, layout: RopeLayout | None) -> tuple[SSAValue, SSAValue | None]:
        """(channel index tile [D padded], each channel's RoPE partner under `layout`, or None)."""
        offs_d = kb.arange(self.dpad, hint="offs_d")
        if layout is None:
            return offs_d, None
        r, half = layout.rotary_dim, layout.rotary_dim // 2
        if layout.style == "half":
            partner = kb.where(
                kb.cmp("<", offs_d, half),
                kb.add(offs_d, half),
                kb.where(kb.cmp("<", offs_d, r), kb.sub(offs_d, half), offs_d),
                hint="partner_d",
            )
        else:
            partner = kb.where(kb.cmp("<", offs_d, r), kb.xor(offs_d, 1), offs_d, hint="partner_d")
        return offs_d, partner

    def load_tile(
        self,
        kb: KernelBuilder,
        base: SSAValue,
        tok_offs: SSAValue,
        tok_ok: SSAValue | None,
        tok_stride: SSAValue | None,
        chan_stride: SSAValue,
        chans: SSAValue,
        tokens_first: bool,
        hint: str,
    ) -> SSAValue:
        """Load a [tokens, head dim] tile (or its transpose), masked where out of range. A
        `tok_stride` of None: `tok_offs` are offsets in elements already."""
        tok_axis, chan_axis = (kb.row, kb.col) if tokens_first else (kb.col, kb.row)
        toks = tok_axis(tok_offs)
        ptr = kb.add(
            kb.add(base, toks if tok_stride is None else kb.mul(toks, tok_stride)),
            kb.mul(chan_axis(chans), chan_stride),
            hint=f"{hint}_ptr",
        )
        mask = tok_axis(tok_ok) if tok_ok is not None else None
        if self.dpad != self.d:
            cmask = chan_axis(kb.cmp("<", chans, self.d))
            mask = cmask if mask is None else kb.and_(mask, cmask)
        return kb.load(ptr, mask, 0.0, hint=hint)

    def transformed(
        self,
        kb: KernelBuilder,
        p: Params,
        ops: Sequence[Operation],
        load: Callable[[SSAValue], SSAValue],
        pos: SSAValue,
        tok_ok: SSAValue | None,
        tokens_first: bool,
        prefix: str,
        signed_pos: bool = False,
    ) -> SSAValue:
        """Load a q/k tile with `load(channels)` and apply rope/norm/scale/hadamard in fp32.

        Before a rope, the pair partners (a second, permuted load) go through the same
        ops, so the rotation needs no data movement between channels. `prefix` names the
        values; `signed_pos`: positions may be negative (queries when Nq > Nk), so the
        tables are read at |pos| and sin takes the position's sign."""
        layout = rope_layout(ops)
        offs_d, partner_d = self.channels(kb, layout)
        x = kb.cast(load(offs_d), f32)
        has_rope = any(isinstance(op, attn.RopeOp) for op in ops)
        xp = kb.cast(load(partner_d), f32) if has_rope and partner_d is not None else None
        tok_axis, chan_axis = (kb.row, kb.col) if tokens_first else (kb.col, kb.row)
        chan_dim = 1 if tokens_first else 0
        for op in ops:
            if isinstance(op, attn.ScaleOp):
                x = kb.mul(x, op.value.value.data)
                xp = kb.mul(xp, op.value.value.data) if xp is not None else None
            elif isinstance(op, attn.NormOp):
                total = kb.reduce("sum", kb.mul(x, x), chan_dim)
                r = tok_axis(
                    kb.unary(tl.RsqrtOp, kb.add(kb.div(total, float(self.d)), op.eps.value.data), hint=f"{prefix}_rstd")
                )
                x = kb.mul(x, r, hint=f"{prefix}_normed")
                xp = kb.mul(xp, r) if xp is not None else None
                if op.weight is not None:
                    w = self.tensor(p, op.weight)
                    dmask = kb.cmp("<", offs_d, self.d) if self.dpad != self.d else None

                    def weight(chans: SSAValue, w=w, dmask=dmask) -> SSAValue:
                        wt = kb.load(kb.add(w.ptr, kb.mul(chans, w.strides[0])), dmask, 0.0)
                        return chan_axis(kb.cast(wt, f32))

                    x = kb.mul(x, weight(offs_d), hint=f"{prefix}_weighted")
                    xp = kb.mul(xp, weight(partner_d)) if xp is not None and partner_d is not None else None
            elif isinstance(op, attn.RopeOp):
                assert xp is not None and partner_d is not None and layout is not None
                x = self.rotated(kb, p, op, layout, x, xp, offs_d, pos, tok_ok, tokens_first, prefix, signed_pos)
                xp = None
            elif isinstance(op, attn.HadamardOp):
                if xp is not None:
                    raise DiagnosticException(
                        "attn.hadamard before attn.rope has no kernel lowering: rotate by RoPE first, then Hadamard"
                    )
                x = self.hadamard(kb, p, op, x, tokens_first)
            else:
                raise DiagnosticException(f"'{op.name}' cannot transform q or k")
        return x

    def rotated(
        self,
        kb: KernelBuilder,
        p: Params,
        op: attn.RopeOp | attn.RopeGradOp,
        layout: RopeLayout,
        x: SSAValue,
        xp: SSAValue,
        offs_d: SSAValue,
        pos: SSAValue,
        tok_ok: SSAValue | None,
        tokens_first: bool,
        prefix: str,
        signed_pos: bool,
        inverse: bool = False,
    ) -> SSAValue:
        """x * cos + partner(x) * sign * sin, for the channel pairs of `layout` (the rotation at
        -pos when `inverse`). `pos`: the rows' positions, or for a rope at explicit positions
        their token indices into its per-call tables (`KernelLowering.positions`)."""
        tok_axis, chan_axis = (kb.row, kb.col) if tokens_first else (kb.col, kb.row)
        r, half = layout.rotary_dim, layout.rotary_dim // 2
        interleaved = layout.style == "interleaved"
        pair = kb.floordiv(offs_d, 2) if interleaved else kb.rem(offs_d, half)
        first = kb.cmp("==", kb.rem(offs_d, 2), 0) if interleaved else kb.cmp("<", offs_d, half)
        sign = kb.where(first, 1.0 if inverse else -1.0, -1.0 if inverse else 1.0, hint=f"{prefix}_sign")
        rotated = kb.cmp("<", offs_d, r)
        cos_ptr, sin_ptr = self.trig_tables(p, op)
        tok_sign = None
        if signed_pos and op.positions is None:  # a position, negative for queries before key 0
            tok_sign = tok_axis(kb.where(kb.cmp("<", pos, 0), -1.0, 1.0))
            pos = kb.unary(tl.AbsOp, pos)
        idx = kb.add(kb.mul(tok_axis(pos), half), chan_axis(pair), hint=f"{prefix}_trig_idx")
        tmask = chan_axis(rotated)
        if tok_ok is not None:
            tmask = kb.and_(tok_axis(tok_ok), tmask)
        cos = kb.load(kb.add(cos_ptr, idx), tmask, 1.0, hint=f"{prefix}_cos")
        sin = kb.mul(kb.load(kb.add(sin_ptr, idx), tmask, 0.0), chan_axis(sign), hint=f"{prefix}_sin")
        if tok_sign is not None:
            sin = kb.mul(sin, tok_sign, hint=f"{prefix}_sin")
        return kb.add(kb.mul(x, cos), kb.mul(xp, sin), hint=f"{prefix}_rot")
