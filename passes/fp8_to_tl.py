"""convert-attn-to-tl's FP8 path (kernel path `fp8`): the kernels of a forward in the FP8 form
and their launcher.

Each quantized operand (q and k always, v where its chain ends in attn.quantize) is written
once, before the attention, as float8 e4m3 values and fp32 scales by its own kernel, after its
transforms (RoPE, QK-norm, scale, Hadamard, in fp32):
- one scale per block of `block` rows of one (batch, head): `quantize_<x>`, a program per block,
  takes the block's largest magnitude, then writes x / scale rounded to e4m3 (scale = largest /
  448, 1 for an all-zero block), as `attnfuse.low_precision.quantize_e4m3` defines it;
- one scale per tensor: `amax_<x>` writes each 64-row tile's largest magnitude, the launcher
  takes the largest of them, and `quantize_<x>` writes the values with it (and the scale).
V's e4m3 copy is stored channel-major ([B, H, D, N], read through a transposed view): the layout
FP8 tensor-core products want for P·V.

The attention kernel is the generic forward (`forward_to_tl`) reading those: S = (q8·k8ᵀ)·sq·sk,
each row's and key's scale gathered by its block. With a quantized V, P·V takes P times each
key's V scale relative to the block's largest (P stays in [0, 1]) times 2^8 (e4m3's normal
range), rounded to e4m3; the product is multiplied back by that largest scale / 2^8. With
kernel-path's `mma = "f32"` the same e4m3 values are multiplied in fp32 (the interpreter, whose
e4m3 dot is wrong, and GPUs without FP8 tensor cores). Where kernel-path chose the sm90 Gluon
kernel (`kernel = "gluon-sm90"`), the launcher runs it on the e4m3 tensors and scales for the
calls it covers (`main_launch`), with the same arithmetic (P through shared memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import Float8E4M3FNType, f32, i32, i64
from xdsl.ir import BlockArgument, Operation, SSAValue

from attnfuse.dialects import attn, tl
from attnfuse.dialects.attn import E4M3_MAX
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.forward_to_tl import ForwardLowering, KvBlock, QBlock
from attnfuse.passes.kernel_lowering import QProgram
from attnfuse.passes.kernel_path import fp8_gluon_min_len, multiplies_e4m3
from attnfuse.passes.launcher_to_tl import KernelCall, LoweredFunction, alloc_like, call_op
from attnfuse.passes.tl_builder import KernelBuilder, Params, TensorParam, pow2

E4M3 = Float8E4M3FNType()
TILE_ROWS = 128
"""Rows a quantization program transforms at a time (and a per-tensor maxima program owns)."""
QUANTIZE_WARPS = 8
P_SCALE = 256.0
"""P's factor before it is rounded to e4m3 (2^8: P in [0, 1] into e4m3's normal range)."""


@dataclass(frozen=True)
class Quantized:
    """One quantized operand of the function."""

    which: str
    """"q", "k" or "v"."""
    arg: BlockArgument
    chain: list[Operation]
    """Its transforms before attn.quantize."""
    block: int
    """Rows per scale (0: one scale for the tensor)."""
    heads: int
    dim: int

    @property
    def rows(self) -> int:
        """Rows one quantization program owns."""
        return self.block or TILE_ROWS

    @property
    def tile(self) -> int:
        """Rows it transforms at a time (a power of two; fewer past head dim 128, so that a tile
        holds at most TILE_ROWS x 128 values)."""
        return min(pow2(self.rows), TILE_ROWS * 128 // max(pow2(self.dim), 128))


class Fp8Lowering(ForwardLowering):
    """Builds the quantization kernels and the e4m3 attention kernel of one forward function."""

    def __init__(self, chains: AttentionChains, arg_names: list[str]):
        super().__init__(chains, arg_names)
        self.e4m3 = multiplies_e4m3(chains.func)
        """Products of e4m3 operands (kernel-path's `mma`); else the same values in fp32."""
        self.quantized: dict[str, Quantized] = {}
        for which, arg, chain, heads, dim in (
            ("q", chains.q_arg, chains.q_chain, self.hq, self.d),
            ("k", chains.k_arg, chains.k_chain, self.hkv, self.d),
            ("v", chains.v_arg, chains.v_chain, self.hkv, self.dv),
        ):
            if chain and isinstance(quant := chain[-1], attn.QuantizeOp):
                self.quantized[which] = Quantized(which, arg, chain[:-1], quant.block.value.data, heads, dim)

    def lower(self) -> LoweredFunction:
        """The quantization kernels, `attn_fwd` and the launcher."""
        calls: list[KernelCall] = []
        for qz in self.quantized.values():
            if qz.block == 0:
                calls.append(self.quantize_kernel(qz, "amax"))
            calls.append(self.quantize_kernel(qz, "values"))
        calls.append(self.main_kernel())
        launcher = self.launcher(calls)
        return self.lowered([c.kernel for c in calls], launcher)

    # ------------------------------------------------------------------ quantization kernels
    def quantize_kernel(self, qz: Quantized, mode: str) -> KernelCall:
        """`amax_<x>` (mode "amax": each program's largest magnitude, for a per-tensor scale) or
        `quantize_<x>` (mode "values": the e4m3 values and their scale)."""
        p = Params()
        kb = KernelBuilder(p, p.block)
        prog = QuantizeProgram(self, qz, p, kb, mode == "values")
        first = prog.tile(kb, 0) if qz.rows <= qz.tile else None
        if mode == "amax" or qz.block:
            amax = prog.largest(kb, first)
            if mode == "amax":
                kb.store(kb.add(p.param("AMAX", tl.PointerType(f32), f"{qz.which}_amax"), prog.slot), amax)
                p.block.add_op(tl.ReturnOp())
                return self._quantize_call(f"amax_{qz.which}", p, qz)
        else:
            amax = kb.load(p.param("AMAX", tl.PointerType(f32), f"{qz.which}_amax_all"), hint="amax")
        scale = kb.where(kb.cmp(">", amax, 0.0), kb.div(amax, E4M3_MAX), 1.0, hint="scale")
        scale_ptr = p.param("SCALE", tl.PointerType(f32), f"{qz.which}_scale")
        if qz.block:
            kb.store(kb.add(scale_ptr, prog.slot), scale)
        else:
            kb.store(scale_ptr, scale, kb.cmp("==", prog.slot, 0))
        if first is not None:
            prog.write(kb, 0, scale, first)
        else:

            def step(ib: KernelBuilder, row: SSAValue, c: dict[str, SSAValue]) -> dict[str, SSAValue]:
                prog.write(ib, row, scale, None)
                return c

            kb.loop(0, qz.rows, qz.tile, {}, step, "first")
        p.block.add_op(tl.ReturnOp())
        return self._quantize_call(f"quantize_{qz.which}", p, qz)

    def _quantize_call(self, kernel: str, p: Params, qz: Quantized) -> KernelCall:
        name = self.host_name(qz.arg)
        grid = [f"_cdiv({name}.shape[2], {qz.rows})", f"{name}.shape[0] * {qz.heads}"]
        return KernelCall(self.kernel(kernel, p), p, grid, QUANTIZE_WARPS, 1)

    # ------------------------------------------------------------------ the attention kernel
    def qkv_params(self, p: Params) -> tuple[TensorParam, TensorParam, TensorParam]:
        """q8 and k8 (and v8 when V is quantized) instead of the arguments."""
        chains = self.chains

        def param(which: str, arg: SSAValue) -> TensorParam:
            if which in self.quantized:
                return self.tensor(p, arg, key=f"{which}8", host=f"{which}8", element=E4M3)
            return self.tensor(p, arg)

        return param("q", chains.q_arg), param("k", chains.k_arg), param("v", chains.v_arg)

    def q_tile(
        self, kb: KernelBuilder, p: Params, q: TensorParam, q_base: SSAValue, ids: QProgram, offs_d: SSAValue
    ) -> SSAValue:
        """The e4m3 Q tile, as its quantization kernel wrote it."""
        return self.qk.load_tile(kb, q_base, ids.rows_m, ids.row_ok, q.strides[2], q.strides[3], offs_d, True, "q8")

    def q_extras(self, kb: KernelBuilder, p: Params, ids: QProgram) -> dict[str, SSAValue]:
        """The Q rows' scales (`sq`), and where K's and V's scales of the program's (batch,
        KV head) start (`sk`, `sv`: the scale itself for a per-tensor one)."""
        extra = {"sq": self.scales(kb, p, "q", ids.b_off, ids.h_off)}
        block = self.quantized["q"].block
        if self.q_scale_is_tile:
            extra["sq"] = kb.load(kb.add(extra["sq"], kb.floordiv(ids.offs_m, block)), ids.row_ok, 1.0, hint="sq")
        elif block:
            extra["sq"] = kb.load(kb.add(extra["sq"], kb.floordiv(ids.m_off, block)), hint="sq")
        for which in ("k", "v"):
            if which in self.quantized:
                extra[f"s{which}"] = self.scales(kb, p, which, ids.b_off, ids.hk_off)
        return extra

    def scales(self, kb: KernelBuilder, p: Params, which: str, b_off: SSAValue, h_off: SSAValue) -> SSAValue:
        """A per-tensor scale, or a pointer to the first block scale of (b, h) of `which`."""
        qz = self.quantized[which]
        ptr = p.param(f"{which}_scale", tl.PointerType(f32), f"{which}_scale")
        if qz.block == 0:
            return kb.load(ptr, hint=f"s{which}")
        n = p.param("NQ" if which == "q" else "NK", i32, f"{self.host_name(qz.arg)}.shape[2]")
        blocks = kb.floordiv(kb.add(n, qz.block - 1), qz.block, hint=f"{which}_blocks")
        row = kb.add(kb.mul(b_off, qz.heads), h_off)
        return kb.add(ptr, kb.mul(row, blocks), hint=f"{which}_scales")

    @property
    def q_scale_is_tile(self) -> bool:
        """Whether Q's scales vary within a Q tile (else one scale serves it)."""
        block = self.quantized["q"].block
        return block > 0 and block % self.block_m != 0

    def key_scale_is_tile(self, which: str) -> bool:
        """Whether K's or V's scales vary within a block of keys (else one scale serves it)."""
        block = self.quantized[which].block
        return block > 0 and block % self.block_n != 0

    def key_scales(self, ib: KernelBuilder, qb: QBlock, which: str, blk: KvBlock, other: float) -> SSAValue:
        """The scales of K's or V's keys in the block: a tile, or one scalar where they share it."""
        block = self.quantized[which].block
        base = qb.extra[f"s{which}"]
        if block == 0:
            return base
        if not self.key_scale_is_tile(which):
            return ib.load(ib.add(base, ib.floordiv(blk.n_off, block)), hint=f"s{which}_n")
        return ib.load(ib.add(base, ib.floordiv(blk.offs_n, block)), blk.kv_ok, other, hint=f"s{which}_n")

    def to_e4m3(self, ib: KernelBuilder, y: SSAValue, hint: str) -> SSAValue:
        """fp32 `y` (within ±448) rounded to e4m3, to nearest even. With e4m3 products a cast;
        else (`mma = "f32"`: the interpreter, whose cast drops the carry when a value rounds up to
        a power of two, 31.8 to 16) rounded in fp32 first, to a multiple of its e4m3 spacing
        2^(e - 3) by adding and subtracting 1.5 x 2^23 spacings, so that the cast is exact."""
        if self.e4m3:
            return ib.cast(y, E4M3, hint=hint)
        # e = floor(log2 |y|), at least -6 (subnormals share 2^-6's spacing): a cast to int
        # truncates, so shift the logarithm positive first.
        log2 = ib.unary(tl.Log2Op, ib.maximum(ib.unary(tl.AbsOp, y), 2.0**-6))
        e = ib.sub(ib.cast(ib.add(log2, 16.0), i32), 16)
        spacing = ib.unary(tl.Exp2Op, ib.cast(ib.sub(e, 3), f32), hint="e4m3_spacing")
        magic = ib.mul(spacing, 1.5 * 2.0**23)
        return ib.cast(ib.sub(ib.add(y, magic), magic), E4M3, hint=hint)

    def operands(self, ib: KernelBuilder, a: SSAValue, b: SSAValue) -> tuple[SSAValue, SSAValue, str | None]:
        """A product's operands and precision: e4m3 as they are, or the same values in fp32."""
        if self.e4m3:
            return a, b, None
        return ib.cast(a, f32), ib.cast(b, f32), "ieee"

    def product(self, ib: KernelBuilder, qb: QBlock, k_tile: SSAValue, blk: KvBlock) -> SSAValue:
        """(q8·k8ᵀ) · sq[row] · sk[key], fp32."""
        a, b, precision = self.operands(ib, qb.q_tile, k_tile)
        s = ib.dot(a, b, None, precision, hint="qk8")
        sq, sk = qb.extra["sq"], self.key_scales(ib, qb, "k", blk, 1.0)
        tile_q, tile_k = self.q_scale_is_tile, self.key_scale_is_tile("k")
        if not tile_q and not tile_k:
            return ib.mul(s, ib.mul(sq, sk), hint="qk")
        s = ib.mul(s, ib.row(sq) if tile_q else sq)
        return ib.mul(s, ib.col(sk) if tile_k else sk, hint="qk")

    def carried_extras(self, kb: KernelBuilder) -> dict[str, SSAValue]:
        """With a quantized V, `v_unit`: the accumulator holds the outputs in units of it."""
        return {"v_unit": kb.value(1.0, f32)} if "v" in self.quantized else {}

    def final_acc(self, kb: KernelBuilder, carried: dict[str, SSAValue]) -> SSAValue:
        if "v" not in self.quantized:
            return carried["acc"]
        return kb.mul(carried["acc"], carried["v_unit"], hint="acc_out")

    def pv(
        self,
        ib: KernelBuilder,
        qb: QBlock,
        blk: KvBlock,
        s: SSAValue,
        pr: SSAValue,
        acc_s: SSAValue,
        c: dict[str, SSAValue],
    ) -> dict[str, SSAValue]:
        """With a quantized V: e4m3(P · w) · v8 added to the accumulator in units of the block's
        largest V scale / 2^8 (the accumulator rescaled from the last block's units, so the
        product accumulates in place), w each key's V scale relative to that largest, times 2^8.
        Else the generic P·V."""
        if "v" not in self.quantized:
            return super().pv(ib, qb, blk, s, pr, acc_s, c)
        v8 = self.v_tile(ib, qb, blk, "v8")
        sv = self.key_scales(ib, qb, "v", blk, 0.0)
        if self.key_scale_is_tile("v"):
            largest = ib.reduce("max", sv, 0, hint="sv_max")
            p8 = self.to_e4m3(ib, ib.mul(pr, ib.col(ib.mul(sv, ib.div(P_SCALE, largest)))), "p8")
        else:
            largest = sv
            p8 = self.to_e4m3(ib, ib.mul(pr, P_SCALE), "p8")
        unit = ib.div(largest, P_SCALE, hint="v_unit_new")
        acc_u = ib.mul(acc_s, ib.div(c["v_unit"], unit), hint="acc_units")
        a, b, precision = self.operands(ib, p8, v8)
        return {"acc": ib.dot(a, b, acc_u, precision, hint="acc_new"), "v_unit": unit}

    # ------------------------------------------------------------------ the launcher
    def scratch_allocs(self) -> list[Operation]:
        """The e4m3 copies, their scales and the per-tensor maxima (`quantized_allocs`)."""
        return [op for qz in self.quantized.values() for op in self.quantized_allocs(qz)]

    def launch_ops(self, c: KernelCall) -> list[Operation]:
        """A quantization kernel's launch; after a maxima kernel, the largest of its maxima (the
        per-tensor maximum; 0 for an empty tensor, whose scale is then 1)."""
        ops: list[Operation] = [call_op(c)]
        callee = c.kernel.sym_name.data
        if callee.startswith("amax_"):
            w = callee.removeprefix("amax_")
            largest = f"{w}_amax.amax(0, keepdim=True) if {w}_amax.numel() else {w}_amax.new_zeros(1)"
            ops.append(tl.HostAssignOp(f"{w}_amax_all", largest))
        return ops

    def main_launch(self, generic: tl.CallOp) -> Operation:
        """The attention kernel's launch: where kernel-path chose the sm90 Gluon kernel, `if
        _gluon_fits(...)` it on the e4m3 tensors and their scales, else the generic kernel."""
        min_len = fp8_gluon_min_len(self.chains.func)
        if min_len is None:
            return generic
        chains = self.chains
        q, k, v = (self.host_name(a) for a in (chains.q_arg, chains.k_arg, chains.v_arg))
        sink = self.host_name(chains.softmax.sink) if chains.softmax.sink is not None else None
        blocks = (str(self.quantized["q"].block), str(self.quantized["k"].block))
        gluon = tl.GluonAttentionOp(
            "q8",
            "k8",
            "v8",
            "out",
            "lse",
            chains.qk.effective_scale,
            bool(chains.masks),
            sink,
            fp8=("q_scale", "k_scale", "v_scale", *blocks),
        )
        return tl.HostIfOp(f"_gluon_fits({q}, {k}, {v}, {min_len})", [gluon], [generic])

    def quantized_allocs(self, qz: Quantized) -> list[Operation]:
        """An operand's e4m3 copy (V's channel-major, seen through a transposed view), its scales
        and, for a per-tensor scale, its programs' maxima."""
        w, x = qz.which, self.host_name(qz.arg)
        dev, dt = f"{x}.device", "torch.float32"
        ops: list[Operation]
        if w == "v":
            shape = [f"{x}.shape[0]", str(qz.heads), str(qz.dim), f"{x}.shape[2]"]
            ops = [tl.AllocOp("v8", shape, "torch.float8_e4m3fn", dev), tl.HostAssignOp("v8", "v8.transpose(2, 3)")]
        else:
            ops = [alloc_like(f"{w}8", x, qz.heads, qz.dim, E4M3)]
        programs = f"{x}.shape[0] * {qz.heads} * _cdiv({x}.shape[2], {qz.rows})"
        if qz.block:
            return [*ops, tl.AllocOp(f"{w}_scale", [programs], dt, dev)]
        return [*ops, tl.AllocOp(f"{w}_amax", [programs], dt, dev), tl.AllocOp(f"{w}_scale", ["1"], dt, dev)]


Tile = tuple[SSAValue, SSAValue, SSAValue]
"""A quantization program's transformed fp32 rows, their indices in the tile, and which are in range."""


class QuantizeProgram:
    """One program of a quantization kernel: its operand's rows `row0 .. row0 + rows` of one
    (batch, head), transformed a tile at a time."""

    def __init__(self, low: Fp8Lowering, qz: Quantized, p: Params, kb: KernelBuilder, values: bool):
        self.low, self.qz, self.p = low, qz, p
        w = qz.which
        self.x = low.tensor(p, qz.arg)
        self.out = low.tensor(p, qz.arg, key=f"{w}8", host=f"{w}8", element=E4M3) if values else None
        self.n = p.param("NQ" if w == "q" else "NK", i32, f"{low.host_name(qz.arg)}.shape[2]")
        pid_n = kb.emit(tl.ProgramIdOp(0), "pid_n")
        pid_bh = kb.emit(tl.ProgramIdOp(1), "pid_bh")
        self.b_off = kb.cast(kb.floordiv(pid_bh, qz.heads), i64, hint="b_off")
        self.h_off = kb.cast(kb.rem(pid_bh, qz.heads), i64, hint="h_off")
        self.row0 = kb.mul(pid_n, qz.rows, hint="row0")
        self.slot = kb.add(kb.mul(kb.cast(pid_bh, i64), kb.emit(tl.NumProgramsOp(0), "programs")), pid_n, hint="slot")
        """The program's scale (or maximum) among all programs'."""

    def base(self, ib: KernelBuilder, t: TensorParam, first: SSAValue | int) -> SSAValue:
        """Where tile `first` of the program's rows starts in `t`."""
        row = ib.cast(self.row0 if isinstance(first, int) else ib.add(self.row0, first), i64)
        bh = ib.add(ib.add(t.ptr, ib.mul(self.b_off, t.strides[0])), ib.mul(self.h_off, t.strides[1]))
        return ib.add(bh, ib.mul(row, t.strides[2]))

    def tile(self, ib: KernelBuilder, first: SSAValue | int) -> Tile:
        """The tile of the program's rows from `first` (0, or a loop's index), transformed."""
        qz, x, w = self.qz, self.x, self.qz.which
        rows = ib.arange(qz.tile, hint="rows")
        local = rows if isinstance(first, int) else ib.add(rows, first, hint="local")
        offs = ib.add(self.row0, local, hint="offs")
        ok = ib.cmp("<", offs, self.n, hint="row_ok")
        if qz.rows % qz.tile:
            ok = ib.and_(ok, ib.cmp("<", local, qz.rows), hint="row_ok")
        base = self.base(ib, x, first)

        def load(chans: SSAValue) -> SSAValue:
            return self.low.qk.load_tile(ib, base, rows, ok, x.strides[2], x.strides[3], chans, True, w)

        if not qz.chain:
            return ib.cast(load(ib.arange(pow2(qz.dim), hint="offs_d")), f32), rows, ok
        pos = offs
        if any(isinstance(op, attn.RopeOp) for op in qz.chain):
            pos = self.low.positions(
                ib, self.p, qz.chain, self.low.row_positions(ib, self.p, w, offs, self.n), self.b_off, offs, ok
            )
        xt = self.low.qk.transformed(ib, self.p, qz.chain, load, pos, ok, True, w, signed_pos=w == "q")
        return xt, rows, ok

    def largest(self, kb: KernelBuilder, first: Tile | None) -> SSAValue:
        """The largest magnitude of the program's rows (`first`: all of them, as one tile)."""
        if first is not None:
            return kb.reduce("max", kb.reduce("max", kb.unary(tl.AbsOp, first[0]), 1), 0, hint="amax")

        def step(ib: KernelBuilder, row: SSAValue, c: dict[str, SSAValue]) -> dict[str, SSAValue]:
            return {"amax": ib.maximum(c["amax"], ib.reduce("max", ib.unary(tl.AbsOp, self.tile(ib, row)[0]), 1))}

        rows_max = kb.loop(0, self.qz.rows, self.qz.tile, {"amax": kb.full([self.qz.tile], 0.0, f32)}, step, "first")
        return kb.reduce("max", rows_max["amax"], 0, hint="amax")

    def write(self, ib: KernelBuilder, first: SSAValue | int, scale: SSAValue, made: Tile | None) -> None:
        """Store tile `first` (`made`, or transformed again) divided by `scale`, as e4m3."""
        assert self.out is not None
        xt, rows, ok = made or self.tile(ib, first)
        y = ib.minimum(ib.maximum(ib.div(xt, scale), -E4M3_MAX), E4M3_MAX, hint=f"{self.qz.which}_scaled")
        o = self.out
        chans = ib.arange(pow2(self.qz.dim), hint="offs_d")
        ptr = ib.add(
            self.base(ib, o, first),
            ib.add(ib.mul(ib.row(rows), o.strides[2]), ib.mul(ib.col(chans), o.strides[3])),
            hint=f"{self.qz.which}8_ptr",
        )
        ib.store(ptr, self.low.to_e4m3(ib, y, f"{self.qz.which}8"), ib.row(ok))
