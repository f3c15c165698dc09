"""convert-attn-to-tl's decode path (kernel path `decode`): the kernels of a forward compiled for
decoding against a KV cache (`Variant.decode`), and their launcher.

A call holds, per sequence b, its first `cache_seqlens[b]` keys (K's transforms applied when
they were written, `Variant.cache_keys`) and values in a cache, and the queries of its last Lq
positions. The kernels are flash-decoding's:

- `attn_decode`: one program per (batch, KV head, split of the cache). Its Q tile packs the
  queries of every query head that reads the KV head (GQA: rows are (head of the group, query)
  pairs), so each K and V block is read once for the whole group. The prologue applies Q's
  transforms at the queries' positions; the KV steps are the forward's (score ops, masks
  through causal-split's bounds, the online softmax in base 2), over the split's keys below the
  sequence's length only: nothing past `cache_seqlens[b]` is read. A paged cache's blocks are
  found through the page table. The program writes its normalised partial output and base-2
  log-sum-exp into fp32 workspaces.
- `attn_decode_combine`: one program per (batch, KV head, packed row): that row's partials of
  every split weighted by their log-sum-exps, the sink counted once, the output row and its
  natural-log lse written.

- `attn_decode_single`: `attn_decode` over the whole cache with the combine's ending: the sink,
  the output rows and their lse written directly. The launcher runs it alone where the cost model
  gives one split (large batches), saving the workspaces and the combine launch.

The launcher chooses the splits by kernel-path's cost model (`tl.decode_splits`) and the packed
tile's rows from the group size and Lq (a power of two, at least the tiling's BLOCK_M).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.dialects.builtin import f32, i32, i64
from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import tl
from attnfuse.dialects.attn import LOG2E
from attnfuse.dialects.tl import dtype_name
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.kernel_lowering import LN2, NEG_INF, KernelLowering, ScoreCtx
from attnfuse.passes.kernel_path import decode_config
from attnfuse.passes.kv_segments import kv_segments
from attnfuse.passes.launcher_to_tl import KernelCall, LoweredFunction, call_op
from attnfuse.passes.tl_builder import KernelBuilder, Params, TensorParam, pow2

COMBINE_CHUNK = 16
"""Splits the combine kernel merges at a time."""
SEQLENS = "cache_seqlens"
PAGE_TABLE = "page_table"


@dataclass
class CacheView:
    """What a decode program's KV steps read: the cache's tensors (and page table), its batch and
    KV head, its sequence's length, the Q tile's rows in range and the tiles' channels."""

    k: TensorParam
    v: TensorParam
    table: TensorParam | None
    b_off: SSAValue
    hk_off: SSAValue
    nk: SSAValue
    row_ok: SSAValue
    offs_d: SSAValue
    offs_dv: SSAValue
    dv_ok: SSAValue | None


class DecodeLowering(KernelLowering):
    """Builds the decode kernels of one forward function and their launcher."""

    def __init__(self, chains: AttentionChains, arg_names: list[str]):
        super().__init__(chains, arg_names)
        self.config = decode_config(chains.func)
        self.group = self.hq // self.hkv
        self.dvp = pow2(self.dv)
        clash = {SEQLENS, PAGE_TABLE} & set(arg_names)
        if clash:
            raise DiagnosticException(
                f"func @{chains.func.sym_name.data}: an argument named {sorted(clash)[0]!r} clashes with the decode "
                "launcher's own parameter; rename it"
            )
        q = self.host_name(chains.q_arg)
        # Rows of the packed Q tile: the next power of two of (query heads per KV head) x Lq.
        self.rows = f"max({self.block_m}, 1 << ({self.group} * {q}.shape[2] - 1).bit_length())"
        k = self.host_name(chains.k_arg)
        page = self.config.page_size
        self.length = f"{PAGE_TABLE}.shape[1] * {page}" if page else f"{k}.shape[2]"
        """The cache's capacity in keys (host expression)."""

    def lower(self) -> LoweredFunction:
        main, combine, single = self.decode_kernel(), self.combine_kernel(), self.decode_kernel(single=True)
        launcher = self.launcher(main, combine, single)
        return self.lowered([main.kernel, combine.kernel, single.kernel], launcher)

    # ------------------------------------------------------------------ the packed Q tile
    def packed_rows(
        self, kb: KernelBuilder, block_m: SSAValue, nq: SSAValue, hk: SSAValue
    ) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue]:
        """(rows, query index, query head, row in range) of the tile packing the group of KV
        head `hk`: row r is query r % Lq of the group's head r // Lq (padding rows repeat the
        last head, so what they read stays in bounds)."""
        rows = kb.arange(block_m, hint="rows_m")
        g = kb.minimum(kb.floordiv(rows, nq), self.group - 1, hint="g")
        qi = kb.rem(rows, nq, hint="qi")
        ok = kb.cmp("<", rows, kb.mul(nq, self.group), hint="row_ok")
        h = kb.add(kb.mul(hk, self.group), g, hint="h")
        return rows, qi, h, ok

    def kv_head_program(self, kb: KernelBuilder) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue, SSAValue]:
        """(pid_bh, b, KV head, b and KV head as int64) of a program on axis 0 (batch x KV heads)."""
        pid_bh = kb.emit(tl.ProgramIdOp(0), "pid_bh")
        b = kb.floordiv(pid_bh, self.hkv, hint="b")
        hk = kb.rem(pid_bh, self.hkv, hint="h_kv")
        return pid_bh, b, hk, kb.cast(b, i64, hint="b_off"), kb.cast(hk, i64, hint="hk_off")

    # ------------------------------------------------------------------ attn_decode
    def decode_kernel(self, single: bool = False) -> KernelCall:
        """`attn_decode`: the packed Q tile against one split of one sequence's cache, its
        partials written; `attn_decode_single` (`single`): the same against the whole cache, the
        output and its lse written (the launch whose cost model gives one split)."""
        chains = self.chains
        p = Params()
        kb = KernelBuilder(p, p.block)
        q = self.tensor(p, chains.q_arg)
        k = self.tensor(p, chains.k_arg)
        v = self.tensor(p, chains.v_arg)
        seqlens = p.param("Seqlens", tl.PointerType(i32), SEQLENS)
        page = self.config.page_size
        table = (
            TensorParam(
                p.param("PageTable", tl.PointerType(i32), PAGE_TABLE),
                [p.param(f"stride_pt_{d}", i32, f"{PAGE_TABLE}.stride({d})") for d in range(2)],
            )
            if page
            else None
        )
        if single:
            out, lse = self.output_params(p)
        else:
            o_part = p.param("OPart", tl.PointerType(f32), "o_part")
            l_part = p.param("LPart", tl.PointerType(f32), "lse_part")
        nq = p.param("NQ", i32, f"{self.host_name(chains.q_arg)}.shape[2]")
        split_keys = p.param("SPLIT_KEYS", i32, "split_keys")
        block_m = p.param("BLOCK_M", i32, "block_m", constexpr=True)
        block_n = p.param("BLOCK_N", i32, str(self.block_n), constexpr=True)

        pid_bh, b, hk, b_off, hk_off = self.kv_head_program(kb)
        split = kb.emit(tl.ProgramIdOp(1), "split")
        n_splits = kb.emit(tl.NumProgramsOp(1), "n_splits")
        nk = kb.load(kb.add(seqlens, b), hint="nk")
        rows, qi, h, row_ok = self.packed_rows(kb, block_m, nq, hk)
        shift = kb.sub(nk, nq, hint="q_shift")
        q_pos = kb.add(qi, shift, hint="q_pos")

        # Q: each row its own (head, query) address; transformed in fp32 at the query's position.
        q_b = kb.add(q.ptr, kb.mul(b_off, q.strides[0]), hint="q_b")
        q_row = kb.add(kb.mul(kb.cast(h, i64), q.strides[1]), kb.mul(kb.cast(qi, i64), q.strides[2]), hint="q_row")

        def load_q(chans: SSAValue, hint: str = "q") -> SSAValue:
            return self.qk.load_tile(kb, q_b, q_row, row_ok, None, q.strides[3], chans, True, hint)

        if chains.q_chain:
            pos = self.positions(kb, p, chains.q_chain, q_pos, b_off, qi, row_ok)
            q_x = self.qk.transformed(kb, p, chains.q_chain, load_q, pos, row_ok, True, "q", signed_pos=True)
            q_tile = kb.cast(q_x, self.dtype, hint="q_tile")
        else:
            q_tile = load_q(kb.arange(self.dpad, hint="offs_d"), "q_tile")

        ctx = ScoreCtx(
            b,
            kb.row(h),
            b_off,
            kb.row(q_pos),
            q_pos,  # replaced per block by the keys' positions
            None,
            None,
            {ids: kb.row(x) for ids, x in self.query_doc_ids(kb, p, b_off, q_pos, row_ok).items()},
            self.fast_tanh,
        )
        offs_d = kb.arange(self.dpad, hint="offs_d")
        offs_dv = kb.arange(self.dvp, hint="offs_dv")
        dv_ok = kb.cmp("<", offs_dv, self.dv, hint="dv_ok") if self.dvp != self.dv else None
        carried = {
            "m_i": kb.full([block_m], NEG_INF, f32, hint="m_i"),
            "l_i": kb.full([block_m], 0.0, f32, hint="l_i"),
            "acc": kb.full([block_m, self.dvp], 0.0, f32, hint="acc"),
        }
        s_lo = kb.mul(split, split_keys, hint="split_lo")
        s_hi = kb.minimum(kb.add(s_lo, split_keys), nk, hint="split_hi")
        q_hi = kb.sub(nk, 1, hint="q_hi")
        for lo, hi, masked in kv_segments(kb, self.kv_bounds, shift, q_hi, nk, self.block_n):
            lo_s, hi_s = kb.maximum(lo, s_lo), kb.minimum(hi, s_hi)

            cache = CacheView(k, v, table, b_off, hk_off, nk, row_ok, offs_d, offs_dv, dv_ok)

            def step(ib: KernelBuilder, start_n: SSAValue, c: dict[str, SSAValue], masked=masked, cache=cache):
                return self.kv_step(ib, p, cache, q_tile, ctx, start_n, c, masked, block_n)

            carried = kb.loop(lo_s, hi_s, block_n, carried, step)

        m_i, l_i, acc = carried["m_i"], carried["l_i"], carried["acc"]
        q_name = self.host_name(chains.q_arg)
        grid = [f"{q_name}.shape[0] * {self.hkv}", "splits"]
        if single:
            self.finish(kb, p, (out, lse, nq), (m_i, l_i, acc), (b, b_off, h, qi, row_ok), offs_dv, (kb.row, kb.col))
            p.block.add_op(tl.ReturnOp())
            return KernelCall(self.kernel("attn_decode_single", p), p, grid, self.num_warps, self.num_stages)
        # The split's partial: normalised output and base-2 lse (-inf where it kept no key).
        empty = kb.cmp("==", l_i, 0.0, hint="empty_row")
        l_safe = kb.where(empty, 1.0, l_i, hint="l_safe")
        part = kb.div(acc, kb.row(l_safe), hint="o_split")
        lse2 = kb.where(empty, NEG_INF, kb.add(m_i, kb.unary(tl.Log2Op, l_safe)), hint="lse_split")
        slot = self.slot(kb, pid_bh, n_splits, split, block_m, rows)
        kb.store(kb.add(o_part, kb.add(kb.row(kb.mul(slot, self.dvp)), kb.col(offs_dv))), part, kb.row(row_ok))
        kb.store(kb.add(l_part, slot), lse2, row_ok)
        p.block.add_op(tl.ReturnOp())
        return KernelCall(self.kernel("attn_decode", p), p, grid, self.num_warps, self.num_stages)

    @staticmethod
    def slot(
        kb: KernelBuilder, pid_bh: SSAValue, n_splits: SSAValue, split: SSAValue, block_m: SSAValue, rows: SSAValue
    ) -> SSAValue:
        """The workspace rows of a split's partials: [batch x KV heads, splits, BLOCK_M], int64."""
        first = kb.mul(kb.add(kb.mul(kb.cast(pid_bh, i64), n_splits), split), block_m, hint="slot0")
        return kb.add(first, rows, hint="slot")

    def kv_step(
        self,
        ib: KernelBuilder,
        p: Params,
        cache: CacheView,
        q_tile: SSAValue,
        ctx0: ScoreCtx,
        start_n: SSAValue,
        c: dict[str, SSAValue],
        masked: bool,
        block_n: SSAValue,
    ) -> dict[str, SSAValue]:
        """One block of the cache: its keys' addresses (through the page table when paged), the
        scores and score ops, the online softmax, P·V."""
        k, v, table, b_off, hk_off, nk = cache.k, cache.v, cache.table, cache.b_off, cache.hk_off, cache.nk
        row_ok, offs_d, offs_dv, dv_ok = cache.row_ok, cache.offs_d, cache.offs_dv, cache.dv_ok
        rows_n = ib.arange(block_n, hint="rows_n")
        offs_n = ib.add(start_n, rows_n, hint="offs_n")
        kv_ok = ib.cmp("<", offs_n, nk, hint="kv_ok") if masked else None
        k_base, v_base, k_rows, v_rows = self.key_rows(ib, k, v, table, b_off, hk_off, start_n, rows_n, offs_n, kv_ok)
        k_tile = self.qk.load_tile(ib, k_base, k_rows, kv_ok, None, k.strides[3], offs_d, False, "k")
        s = self.scores(ib, ib.dot(q_tile, k_tile, None, self.precision, hint="qk"))
        kv_idx = ib.col(offs_n)
        if masked:
            assert kv_ok is not None
            kv_ok_col = ib.col(kv_ok)
            valid = ib.and_(ib.row(row_ok), kv_ok_col)
        else:
            kv_ok_col = valid = ib.row(row_ok)
        ctx = ScoreCtx(ctx0.b, ctx0.h, ctx0.b_off, ctx0.q_idx, kv_idx, kv_ok_col, valid, ctx0.doc_q, ctx0.fast_tanh)
        s = self.score_ops(ib, p, s, ctx, masked)
        if masked:
            s = ib.where(kv_ok_col, s, NEG_INF, hint="s_valid")
        m_new, l_new, pr, acc_s = self.online_softmax(ib, s, c)
        v_ptr = ib.add(ib.add(v_base, ib.row(v_rows)), ib.mul(ib.col(offs_dv), v.strides[3]), hint="v_ptr")
        vmask = ib.row(kv_ok) if kv_ok is not None else None
        if dv_ok is not None:
            vmask = ib.col(dv_ok) if vmask is None else ib.and_(vmask, ib.col(dv_ok))
        vv = ib.load(v_ptr, vmask, 0.0, hint="v")
        acc_n = ib.dot(ib.cast(pr, self.vdtype), vv, acc_s, self.precision, hint="acc_new")
        return {"m_i": m_new, "l_i": l_new, "acc": acc_n}

    def key_rows(
        self,
        ib: KernelBuilder,
        k: TensorParam,
        v: TensorParam,
        table: TensorParam | None,
        b_off: SSAValue,
        hk_off: SSAValue,
        start_n: SSAValue,
        rows_n: SSAValue,
        offs_n: SSAValue,
        kv_ok: SSAValue | None,
    ) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue]:
        """(K's base, V's base, each key's offset from K's base and from V's, in elements) of a
        block of keys. Contiguous: the sequence's rows. Paged with pages at least a block long:
        the block's one page. Smaller pages: each key's page, through the page table."""
        page = self.config.page_size

        def rows_of(stride: SSAValue, hint: str) -> SSAValue:
            return ib.mul(ib.cast(rows_n, i64), stride, hint=hint)

        if table is None:
            n_off = ib.cast(start_n, i64, hint="n_off")

            def base(t: TensorParam, hint: str) -> SSAValue:
                bh = ib.add(ib.add(t.ptr, ib.mul(b_off, t.strides[0])), ib.mul(hk_off, t.strides[1]))
                return ib.add(bh, ib.mul(n_off, t.strides[2]), hint=hint)

            return base(k, "k_blk"), base(v, "v_blk"), rows_of(k.strides[2], "k_rows"), rows_of(v.strides[2], "v_rows")
        pt_row = ib.add(table.ptr, ib.mul(b_off, table.strides[0]), hint="pt_row")
        if page >= self.block_n:
            page_id = ib.load(ib.add(pt_row, ib.mul(ib.floordiv(start_n, page), table.strides[1])), hint="page")
            page_off = ib.cast(page_id, i64, hint="page_off")
            first = ib.cast(ib.rem(start_n, page), i64, hint="slot")

            def paged_base(t: TensorParam, hint: str) -> SSAValue:
                at = ib.add(ib.mul(page_off, t.strides[0]), ib.mul(first, t.strides[1]))
                return ib.add(ib.add(t.ptr, at), ib.mul(hk_off, t.strides[2]), hint=hint)

            return (
                paged_base(k, "k_blk"),
                paged_base(v, "v_blk"),
                rows_of(k.strides[1], "k_rows"),
                rows_of(v.strides[1], "v_rows"),
            )
        page_ids = ib.load(ib.add(pt_row, ib.mul(ib.floordiv(offs_n, page), table.strides[1])), kv_ok, 0, hint="pages")
        pages = ib.cast(page_ids, i64, hint="page_off")
        slots = ib.cast(ib.rem(offs_n, page), i64, hint="slots")

        def scattered(t: TensorParam, hint: str) -> SSAValue:
            return ib.add(ib.mul(pages, t.strides[0]), ib.mul(slots, t.strides[1]), hint=hint)

        k_head = ib.add(k.ptr, ib.mul(hk_off, k.strides[2]), hint="k_head")
        v_head = ib.add(v.ptr, ib.mul(hk_off, v.strides[2]), hint="v_head")
        return k_head, v_head, scattered(k, "k_rows"), scattered(v, "v_rows")

    # ------------------------------------------------------------------ attn_decode_combine
    def combine_kernel(self) -> KernelCall:
        """`attn_decode_combine`: one program per (batch x KV head, packed row): the splits'
        partials of that row, `COMBINE_CHUNK` splits at a time, weighted by their lse; the sink;
        the output row and its lse."""
        chains = self.chains
        p = Params()
        kb = KernelBuilder(p, p.block)
        o_part = p.param("OPart", tl.PointerType(f32), "o_part")
        l_part = p.param("LPart", tl.PointerType(f32), "lse_part")
        out, lse = self.output_params(p)
        nq = p.param("NQ", i32, f"{self.host_name(chains.q_arg)}.shape[2]")
        n_splits = p.param("N_SPLITS", i32, "splits")
        block_m = p.param("BLOCK_M", i32, "block_m", constexpr=True)
        chunk = p.param("CHUNK", i32, str(COMBINE_CHUNK), constexpr=True)
        pid_bh, b, hk, b_off, _ = self.kv_head_program(kb)
        row = kb.emit(tl.ProgramIdOp(1), "row")
        qi = kb.rem(row, nq, hint="qi")
        h = kb.add(kb.mul(hk, self.group), kb.floordiv(row, nq), hint="h")
        offs_s = kb.arange(chunk, hint="offs_s")
        offs_dv = kb.arange(self.dvp, hint="offs_dv")
        carried = {
            "m_i": kb.full([], NEG_INF, f32, hint="m_i"),
            "l_i": kb.full([], 0.0, f32, hint="l_i"),
            "acc": kb.full([self.dvp], 0.0, f32, hint="acc"),
        }

        def merge(ib: KernelBuilder, s0: SSAValue, c: dict[str, SSAValue]) -> dict[str, SSAValue]:
            split = ib.add(s0, offs_s, hint="split")
            ok = ib.cmp("<", split, n_splits, hint="split_ok")
            slot = self.slot(ib, pid_bh, n_splits, split, block_m, row)
            lse_s = ib.load(ib.add(l_part, slot), ok, NEG_INF, hint="lse_s")
            o_ptr = ib.add(o_part, ib.add(ib.row(ib.mul(slot, self.dvp)), ib.col(offs_dv)))
            o_s = ib.load(o_ptr, ib.row(ok), 0.0, hint="o_s")
            m_new = ib.maximum(c["m_i"], ib.reduce("max", lse_s, 0), hint="m_new")
            m_safe = ib.where(ib.cmp("==", m_new, NEG_INF), 0.0, m_new, hint="m_safe")
            alpha = ib.unary(tl.Exp2Op, ib.sub(c["m_i"], m_safe), hint="alpha")
            w = ib.unary(tl.Exp2Op, ib.sub(lse_s, m_safe), hint="w")
            l_new = ib.add(ib.mul(c["l_i"], alpha), ib.reduce("sum", w, 0), hint="l_new")
            acc = ib.add(ib.mul(c["acc"], alpha), ib.reduce("sum", ib.mul(o_s, ib.row(w)), 0), hint="acc_new")
            return {"m_i": m_new, "l_i": l_new, "acc": acc}

        m_i, l_i, acc = kb.loop(0, n_splits, chunk, carried, merge, iv_name="s0").values()
        self.finish(kb, p, (out, lse, nq), (m_i, l_i, acc), (b, b_off, h, qi, None), offs_dv, (_same, _same))
        p.block.add_op(tl.ReturnOp())
        q = self.host_name(chains.q_arg)
        grid = [f"{q}.shape[0] * {self.hkv}", f"{self.group} * {q}.shape[2]"]
        return KernelCall(self.kernel("attn_decode_combine", p), p, grid, 4, 1)

    # ------------------------------------------------------------------ the output
    def output_params(self, p: Params) -> tuple[TensorParam, SSAValue]:
        """The output [B, Hq, Lq, Dv] (with its strides) and the lse [B, Hq, Lq] parameters."""
        out_ptr = p.param("Out", tl.PointerType(self.dtype), "out")
        out = TensorParam(out_ptr, [p.param(f"stride_o_{d}", i32, f"out.stride({d})") for d in range(4)])
        return out, p.param("Lse", tl.PointerType(f32), "lse")

    def finish(
        self,
        kb: KernelBuilder,
        p: Params,
        dest: tuple[TensorParam, SSAValue, SSAValue],
        state: tuple[SSAValue, SSAValue, SSAValue],
        where: tuple[SSAValue, SSAValue, SSAValue, SSAValue, SSAValue | None],
        offs_dv: SSAValue,
        spread: tuple[Callable[[SSAValue], SSAValue], Callable[[SSAValue], SSAValue]],
    ) -> None:
        """The sink merged (counted once), the rows normalised, the output rows and their
        natural-log lse written. `dest`: (out, lse, Lq); `state`: the base-2 (m, l, acc) of the
        rows; `where`: (batch, batch as int64, query head, query index, rows in range or None);
        `spread`: how a per-row value and a per-channel one broadcast over acc (a tile of rows:
        [:, None] and [None, :]; the combine's one row: as they are)."""
        out, lse, nq = dest
        m_i, l_i, acc = state
        b, b_off, h, qi, row_ok = where
        row, col = spread
        sink_arg = self.chains.softmax.sink
        if sink_arg is not None:
            sink = self.tensor(p, sink_arg)
            sk = kb.mul(
                kb.cast(kb.load(kb.add(sink.ptr, kb.mul(kb.cast(h, i64), sink.strides[0])), hint="sink"), f32),
                LOG2E,
                hint="sink2",
            )
            m_new = kb.maximum(m_i, sk, hint="m_sink")
            alpha = kb.unary(tl.Exp2Op, kb.sub(m_i, m_new))
            l_i = kb.add(kb.mul(l_i, alpha), kb.unary(tl.Exp2Op, kb.sub(sk, m_new)), hint="l_sink")
            acc, m_i = kb.mul(acc, row(alpha)), m_new
        empty = kb.cmp("==", l_i, 0.0, hint="empty_row")
        l_safe = kb.where(empty, 1.0, l_i, hint="l_safe")
        o = kb.cast(kb.div(acc, row(l_safe)), self.dtype, hint="out")
        o_row = kb.add(kb.mul(kb.cast(h, i64), out.strides[1]), kb.mul(kb.cast(qi, i64), out.strides[2]), hint="o_row")
        o_base = kb.add(kb.add(out.ptr, kb.mul(b_off, out.strides[0])), row(o_row))
        o_ptr = kb.add(o_base, col(kb.mul(offs_dv, out.strides[3])), hint="o_ptr")
        mask = None if row_ok is None else row(row_ok)
        if self.dvp != self.dv:
            dv_ok = col(kb.cmp("<", offs_dv, self.dv))
            mask = dv_ok if mask is None else kb.and_(mask, dv_ok)
        kb.store(o_ptr, o, mask)
        lse_v = kb.where(empty, NEG_INF, kb.mul(kb.add(m_i, kb.unary(tl.Log2Op, l_safe)), LN2), hint="lse")
        lse_row = kb.add(kb.mul(kb.add(kb.mul(kb.cast(b, i64), self.hq), kb.cast(h, i64)), nq), kb.cast(qi, i64))
        kb.store(kb.add(lse, lse_row), lse_v, row_ok)

    # ------------------------------------------------------------------ the launcher
    def launcher(self, main: KernelCall, combine: KernelCall, single: KernelCall) -> tl.LauncherOp:
        """`launch(q, k, v, *extras, cache_seqlens[, page_table], *, lse=None)`: the splits, the
        RoPE tables, then `attn_decode_single` where the cost model gives one split, else the
        workspaces, `attn_decode` and the combine; returns (out, lse)."""
        q = self.host_name(self.chains.q_arg)
        dev = f"{q}.device"
        rows = f"{q}.shape[0] * {self.hkv}"
        c = self.config
        ops: list[Operation] = [
            tl.AllocOp(
                "out",
                [f"{q}.shape[0]", str(self.hq), f"{q}.shape[2]", str(self.dv)],
                dtype_name(self.dtype, "torch"),
                dev,
            ),
            tl.AllocOp("lse", [f"{q}.shape[0]", str(self.hq), f"{q}.shape[2]"], "torch.float32", dev, given=True),
            tl.DecodeSplitsOp(
                "splits", "split_keys", rows, self.length, self.block_n, c.waves, c.min_split_keys, c.splits, dev
            ),
            tl.HostAssignOp("block_m", self.rows),
        ]
        ops += self.rope_host_ops(dev, f"max({q}.shape[2], {self.length})")
        split = [
            tl.AllocOp("o_part", [f"{rows} * splits * block_m", str(self.dvp)], "torch.float32", dev),
            tl.AllocOp("lse_part", [f"{rows} * splits * block_m"], "torch.float32", dev),
            call_op(main),
            call_op(combine),
        ]
        ops.append(tl.HostIfOp("splits == 1", [call_op(single)], split))
        ops.append(tl.HostReturnOp(["out", "lse"]))
        params = [*self.names, SEQLENS, *([PAGE_TABLE] if c.page_size else [])]
        return tl.LauncherOp("launch", params, ops)


def _same(x: SSAValue) -> SSAValue:
    return x
