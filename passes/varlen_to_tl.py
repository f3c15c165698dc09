"""convert-attn-to-tl's varlen path (kernel path `varlen`): the generic forward over a batch of
packed sequences of different lengths (`Variant.varlen`).

The launcher takes q, k and v as [1, H, total, D] (views of the packed [total, H, D] tensors),
`cu_seqlens_q` and `cu_seqlens_k` (int32 [S + 1], each sequence's first token) and
`max_seqlen_q`. `attn_fwd` is the generic forward (`forward_to_tl`) with one program per
(sequence x head, Q block of the longest sequence): a program finds its sequence's first query
and key and its lengths in the cu_seqlens, addresses its tiles from there, and takes positions
within its sequence (keys 0..Nk-1, queries the last Nq), so each sequence is computed as the
ordinary call on it alone and no tile spans two sequences. A program past its sequence's last
query block visits no keys. K's transforms run in the KV loop (rope-fusion), at positions
within the sequence.

A backward function on the varlen path (`VarlenBackwardLowering`) gets the generic backward's
kernels with the same addressing, and pre-rotation kernels that read each token's position in
its sequence from the launcher.
"""

from __future__ import annotations

from xdsl.dialects.builtin import i32, i64
from xdsl.ir import SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.backward_to_tl import BackwardLowering
from attnfuse.passes.forward_to_tl import ForwardLowering
from attnfuse.passes.kernel_lowering import KernelLowering, KvProgram, QProgram
from attnfuse.passes.tl_builder import KernelBuilder, Params

CU_Q, CU_K, MAX_Q, MAX_K = "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"
POS_Q, POS_K = "positions_q", "positions_k"
"""The backward launcher's int32 [total] tensors: each packed token's position in its sequence."""


def per_token_extras(chains: AttentionChains) -> list[str]:
    """What a varlen call cannot take, described: extras indexed by token (RoPE positions,
    document ids), which a packed batch would need per sequence."""
    found = []
    for op in (*chains.q_chain, *chains.k_chain):
        if isinstance(op, attn.RopeOp) and op.positions is not None:
            found.append("RoPE positions")
    found += ["document ids" for m in chains.masks if m.kind.data == "document"]
    return list(dict.fromkeys(found))


def sequence_bounds(
    kb: KernelBuilder, cu_q: SSAValue, cu_k: SSAValue, seq: SSAValue, nq_hint: str, nk_hint: str
) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue]:
    """(first query, queries, first key, keys) of packed sequence `seq`, from the cu_seqlens."""
    q_start = kb.load(kb.add(cu_q, seq), hint="q_start")
    nxt = kb.add(seq, 1, hint="next_seq")
    nq = kb.sub(kb.load(kb.add(cu_q, nxt)), q_start, hint=nq_hint)
    k_start = kb.load(kb.add(cu_k, seq), hint="k_start")
    return q_start, nq, k_start, kb.sub(kb.load(kb.add(cu_k, nxt)), k_start, hint=nk_hint)


def varlen_q_program(
    lw: KernelLowering, kb: KernelBuilder, lengths: tuple[SSAValue, ...], block_m: SSAValue
) -> tuple[SSAValue, SSAValue, QProgram]:
    """(Nq, Nk, the program's Q block) of a program on a grid (sequences x heads, Q blocks): its
    sequence's lengths (Nk 0 past its last Q block: no keys to visit), rows addressed from the
    sequence's first query and key, positions within the sequence."""
    cu_q, cu_k, total_q = lengths
    pid = kb.emit(tl.ProgramIdOp(0), "pid_bh")
    num_q_blocks = kb.emit(tl.NumProgramsOp(1), "num_q_blocks")
    pid_m = kb.sub(kb.sub(num_q_blocks, 1), kb.emit(tl.ProgramIdOp(1), "q_block"), hint="pid_m")
    seq = kb.floordiv(pid, lw.hq, hint="seq")
    h = kb.rem(pid, lw.hq, hint="h")
    hk = kb.floordiv(h, lw.hq // lw.hkv, hint="h_kv") if lw.hq != lw.hkv else h
    q_start, nq, k_start, nk_seq = sequence_bounds(kb, cu_q, cu_k, seq, "nq", "nk_seq")
    m_start = kb.mul(pid_m, block_m, hint="m_start")
    nk = kb.where(kb.cmp("<", m_start, nq), nk_seq, 0, hint="nk")
    b = kb.value(0)
    b_off = kb.cast(b, i64, hint="b_off")
    h_off = kb.cast(h, i64, hint="h_off")
    hk_off = kb.cast(hk, i64, hint="hk_off") if hk is not h else h_off
    m_off = kb.cast(kb.add(q_start, m_start), i64, hint="m_off")
    rows_m = kb.arange(block_m, hint="rows_m")
    offs_m = kb.add(m_start, rows_m, hint="offs_m")
    row_ok = kb.cmp("<", offs_m, nq, hint="row_ok")
    shift = kb.sub(nk_seq, nq, hint="q_shift")
    q_pos = kb.add(offs_m, shift, hint="q_pos")
    ids = QProgram(
        pid, num_q_blocks, pid_m, b, h, b_off, h_off, hk_off, m_start, m_off, rows_m, offs_m, row_ok, shift, q_pos
    )
    ids.k_row0 = kb.cast(k_start, i64, hint="k_row0")
    ids.lse_row0 = kb.add(kb.mul(h_off, total_q), m_off, hint="lse_row0")
    return nq, nk, ids


def check_varlen(lw: KernelLowering, chains: AttentionChains, arg_names: list[str], own: set[str]) -> None:
    """A varlen function: no argument named as the launcher's own parameters, no per-token extras."""
    where = f"func @{chains.func.sym_name.data}"
    clash = own & set(arg_names)
    if clash:
        raise DiagnosticException(f"{where}: an argument named {sorted(clash)[0]!r} clashes with the varlen launcher's")
    bad = per_token_extras(chains)
    if bad:
        raise DiagnosticException(f"{where}: a varlen call takes no per-token extras, found {', '.join(bad)}")


def varlen_lengths(lw: KernelLowering, p: Params) -> tuple[SSAValue, ...]:
    """cu_seqlens_q, cu_seqlens_k, and the packed queries' total (lse's row length)."""
    q = lw.host_name(lw.chains.q_arg)
    return (
        p.param("CuQ", tl.PointerType(i32), CU_Q),
        p.param("CuK", tl.PointerType(i32), CU_K),
        p.param("TQ", i32, f"{q}.shape[2]"),
    )


class VarlenLowering(ForwardLowering):
    """The generic forward over packed sequences (see the module docstring)."""

    def __init__(self, chains: AttentionChains, arg_names: list[str]):
        super().__init__(chains, arg_names)
        check_varlen(self, chains, arg_names, {CU_Q, CU_K, MAX_Q})

    def length_params(self, p: Params) -> tuple[SSAValue, ...]:
        return varlen_lengths(self, p)

    def program(
        self, kb: KernelBuilder, lengths: tuple[SSAValue, ...], block_m: SSAValue
    ) -> tuple[SSAValue, SSAValue, QProgram]:
        """The program's sequence, head and Q block (`varlen_q_program`)."""
        return varlen_q_program(self, kb, lengths, block_m)

    def grid(self) -> list[str]:
        """(sequences x heads, Q blocks of the longest sequence)."""
        return [f"({CU_Q}.shape[0] - 1) * {self.hq}", f"_cdiv({MAX_Q}, {self.block_m})"]

    def launcher_params(self) -> list[str]:
        return [*self.names, CU_Q, CU_K, MAX_Q]


class VarlenBackwardLowering(BackwardLowering):
    """The generic backward over packed sequences: each sequence's rows as the ordinary
    backward's, addressed from its first query and key. The dQ kernel's programs are the
    forward's (sequence x head, Q block); the dK/dV kernel's are (KV block of the longest
    sequence, sequence x KV head); the pre-rotation kernels rotate each token at its position in
    its sequence (`positions_q`, `positions_k`, which the caller computes from the cu_seqlens)."""

    def __init__(self, chains: AttentionChains, arg_names: list[str]):
        super().__init__(chains, arg_names)
        check_varlen(self, chains, arg_names, {CU_Q, CU_K, MAX_Q, MAX_K, POS_Q, POS_K})

    def length_params(self, p: Params) -> tuple[SSAValue, ...]:
        return varlen_lengths(self, p)

    def program(
        self, kb: KernelBuilder, lengths: tuple[SSAValue, ...], block_m: SSAValue
    ) -> tuple[SSAValue, SSAValue, QProgram]:
        return varlen_q_program(self, kb, lengths, block_m)

    def kv_program(self, kb: KernelBuilder, lengths: tuple[SSAValue, ...], block_m: SSAValue) -> KvProgram:
        """The program's sequence, KV head and block of keys; no queries to visit past its
        sequence's last block of keys."""
        cu_q, cu_k, total_q = lengths
        pid_n = kb.emit(tl.ProgramIdOp(0), "pid_n")
        pid = kb.emit(tl.ProgramIdOp(1), "pid_bh")
        seq = kb.floordiv(pid, self.hkv, hint="seq")
        hk = kb.rem(pid, self.hkv, hint="h_kv")
        q_start, nq_seq, k_start, nk = sequence_bounds(kb, cu_q, cu_k, seq, "nq_seq", "nk")
        n_start = kb.mul(pid_n, block_m, hint="n_start")
        nq = kb.where(kb.cmp("<", n_start, nk), nq_seq, 0, hint="nq")
        b = kb.value(0)
        rows_n = kb.arange(block_m, hint="rows_n")
        offs_n = kb.add(n_start, rows_n, hint="offs_n")
        q_row0 = kb.cast(q_start, i64, hint="q_row0")
        return KvProgram(
            pid_n,
            pid,
            b,
            hk,
            kb.cast(b, i64, hint="b_off"),
            kb.cast(hk, i64, hint="hk_off"),
            n_start,
            kb.cast(kb.add(k_start, n_start), i64, hint="n_off"),
            rows_n,
            offs_n,
            kb.cmp("<", offs_n, nk, hint="kv_ok"),
            nq,
            nk,
            q_row0=q_row0,
            lse_heads=total_q,
            lse_row0=q_row0,
        )

    def row_positions(self, kb: KernelBuilder, p: Params, which: str, offs_n: SSAValue, n: SSAValue) -> SSAValue:
        """Each packed token's position in its sequence (the launcher's `positions_q`/`_k`)."""
        t = p.param(f"Pos{which.upper()}", tl.PointerType(i32), POS_Q if which == "q" else POS_K)
        return kb.load(kb.add(t, offs_n), kb.cmp("<", offs_n, n), 0, hint=f"{which}_pos")

    def dkdv_grid(self) -> list[str]:
        return [f"_cdiv({MAX_K}, {self.block_m})", f"({CU_Q}.shape[0] - 1) * {self.hkv}"]

    def dq_grid(self) -> list[str]:
        return [f"({CU_Q}.shape[0] - 1) * {self.hq}", f"_cdiv({MAX_Q}, {self.block_m})"]

    def launcher_params(self) -> list[str]:
        return [*self.names, CU_Q, CU_K, MAX_Q, MAX_K, POS_Q, POS_K]
