"""The Gluon backward's generated hooks, evaluated on the CPU (as test_gluon_kv_range.py does for
the forward's).

A backward module kernel-path gives the sm90 Gluon kernels carries the `@triton.jit` functions
they call for a variant's masks and score ops: `gluon_bwd_range` (the 64-row query blocks a block
of keys meets, for the dK/dV kernel), `gluon_bwd_kv_range` (the 64-key blocks a 128-row Q tile
meets, for the dQ kernel) and `gluon_bwd_masked` / `gluon_bwd_full` (P and dS of a block). Here
small wrapper kernels call them under the interpreter, and their answers are checked against the
masks' definitions (Nq = Nk, queries and keys at the same positions):

- every (query, key) pair a mask keeps lies in a visited block, and every block run without mask
  code is kept whole (for the masks causal-split understands the bounds are exact: no block is
  visited that holds no kept pair, and every whole block is run unmasked);
- on a transposed block (keys along rows, as the dK/dV kernel has it) the masked function gives
  P = 1 and dS = dP - delta where the mask keeps the pair, and exactly 0 for both elsewhere;
- both P/dS functions give the same bits for (dP - delta, 0.0) as for (dP, delta), which the
  dK/dV kernel relies on at head dim 128.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import triton.language as tl
from kernel_harness import variant
from test_gluon_kv_range import FAMILIES, N, _kept
from triton.runtime.interpreter import InterpretedFunction

from attnfuse.cache import interpreter_library, load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module

ROWS = 64  # a step of the Gluon backward's loops (passes/kernel_path.GLUON_BWD_BLOCK)
KEYS = 128  # the dK/dV kernel's block of keys
TILE = 128  # the dQ kernel's Q tile


def _ranges(out, n, RANGE: tl.constexpr, WIDTH: tl.constexpr):  # noqa: N803 (named as the kernels name them)
    """out[lo] = RANGE(lo, lo + WIDTH - 1, n) for every first position lo of a WIDTH-row block."""
    lo = tl.arange(0, 1024)
    ok = lo <= n - WIDTH
    zero = tl.zeros_like(lo)
    a, f_a, f_b, b = RANGE(lo, lo + WIDTH - 1, n)
    tl.store(out + lo * 4 + 0, a + zero, mask=ok)
    tl.store(out + lo * 4 + 1, f_a + zero, mask=ok)
    tl.store(out + lo * 4 + 2, f_b + zero, mask=ok)
    tl.store(out + lo * 4 + 3, b + zero, mask=ok)


def _block(p_out, ds_out, HOOK: tl.constexpr):  # noqa: N803
    """P and dS of the transposed block (keys i*64.., queries j*64..) with S = 0, dP = 1,
    lse2 = 0, delta = 0.25."""
    i, j = tl.program_id(0), tl.program_id(1)
    n = tl.num_programs(0) * 64
    keys, queries = i * 64 + tl.arange(0, 64), j * 64 + tl.arange(0, 64)
    zeros = tl.zeros([64, 64], tl.float32)
    lse2 = tl.zeros([1, 64], tl.float32)
    p, ds = HOOK(zeros, zeros + 1.0, lse2, lse2 + 0.25, queries[None, :], keys[:, None], 0)
    offs = keys[:, None] * n + queries[None, :]
    tl.store(p_out + offs, p)
    tl.store(ds_out + offs, ds)


def _folded(s_in, dp_in, lse2_in, delta_in, out, HOOK: tl.constexpr):  # noqa: N803
    """The hook's (P, dS) on one transposed 64 x 64 block twice: with (dP, delta), and with
    (dP - delta, 0.0), as the dK/dV kernel passes them at head dim 128 (`FOLD_DELTA`)."""
    rows, cols = tl.arange(0, 64)[:, None], tl.arange(0, 64)[None, :]
    s = tl.load(s_in + rows * 64 + cols)
    dp = tl.load(dp_in + rows * 64 + cols)
    lse2 = tl.load(lse2_in + cols)
    delta = tl.load(delta_in + cols)
    queries, keys = tl.arange(0, 64)[None, :] + 64, tl.arange(0, 64)[:, None] + 64
    p, ds = HOOK(s, dp, lse2, delta, queries, keys, 0)
    p_f, ds_f = HOOK(s, dp - delta, lse2, 0.0, queries, keys, 0)
    tl.store(out + rows * 64 + cols, p)
    tl.store(out + 4096 + rows * 64 + cols, ds)
    tl.store(out + 2 * 4096 + rows * 64 + cols, p_f)
    tl.store(out + 3 * 4096 + rows * 64 + cols, ds_f)


RANGES = InterpretedFunction(_ranges)
BLOCKS = InterpretedFunction(_block)
FOLDED = InterpretedFunction(_folded)


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> dict[str, tuple]:
    """Each family's (RANGE_Q, RANGE_KV, FULL, MASKED), as its generated backward module's
    launcher hands them to `_gluon_backward` (sm 90, loaded for the interpreter, exact tanh)."""
    folder = Path(tmp_path_factory.mktemp("gluon_bwd_hooks"))
    found = {}
    for name, (ops, _, _) in FAMILIES.items():
        extras = ["%ids: tensor<?x?xi32>"] if "document" in name else []
        ir = variant(dtype=torch.bfloat16, hq=4, hkv=2, d=128, score_ops=ops, extras=extras)
        source = compile_module(
            parse_module(ir), sm=90, seq_len=4096, direction="bwd", wrt=(0, 1, 2), tanh="exact"
        ).source
        module = load_source(source, folder, interpret=True)
        calls: list[tuple] = []
        module._gluon_bwd_fits = lambda *args: True
        module._gluon_backward = lambda *args, calls=calls, **kwargs: calls.append(args)
        module._launch = lambda *args: None
        q, k = torch.zeros(1, 4, KEYS, 128, dtype=torch.bfloat16), torch.zeros(1, 2, KEYS, 128, dtype=torch.bfloat16)
        ids = [torch.zeros(1, KEYS, dtype=torch.int32)] if extras else []
        module.launch(q, k, k.clone(), *ids, q.clone(), torch.zeros(1, 4, KEYS), q.clone())
        ((args,),) = [calls]
        found[name] = args[10]
    return found


def _bounds(kept: torch.Tensor, width: int, step: int, opaque: bool) -> torch.Tensor:
    """For every block of `width` rows of `kept` ([rows, cols]) starting at each row: the first
    `step`-aligned column block holding a kept pair (its start), one past the last kept column,
    and whether each `step`-column block is kept whole by every row (never, opaque)."""
    tiles = kept.unfold(0, width, 1)  # [first row, column, row of the block]
    some, every = tiles.any(-1), tiles.all(-1)
    cols = torch.arange(kept.shape[1])
    first = torch.where(some, cols, kept.shape[1]).min(-1).values
    last = torch.where(some, cols, -1).max(-1).values
    full = every.view(every.shape[0], -1, step).all(-1) & (not opaque)
    return torch.cat([(first // step * step)[:, None], (last + 1)[:, None], full.long()], 1)


def _check_range(name: str, out: torch.Tensor, kept: torch.Tensor, width: int, step: int, opaque: bool) -> None:
    lo, f_lo, f_hi, hi = out.long().unbind(1)
    blocks = torch.arange(N // step)
    # Blocks are visited from lo // step, and run unmasked from cdiv(full_lo) to full_hi // step
    # (the kernels' own rounding: `_glb_tile`, `_glbq_tile`).
    full = (blocks >= (f_lo[:, None] + step - 1) // step) & (blocks < (f_hi // step)[:, None])
    visited_from = lo // step * step
    got = torch.cat([visited_from[:, None], hi[:, None], full.long()], 1)
    want = _bounds(kept, width, step, opaque)
    ordered = (0 <= lo) & (lo <= f_lo) & (f_lo <= f_hi) & (f_hi <= hi) & (hi <= N)
    if opaque:  # sound, not exact: every kept pair visited, nothing unmasked
        bad = ~ordered | (visited_from > want[:, 0]) | (hi < want[:, 1]) | full.any(1)
    else:
        bad = ~ordered | (got != want).any(1)
    for first in bad.nonzero().flatten().tolist()[:1]:
        raise AssertionError(
            f"{name}, rows {first}..{first + width - 1}: (lo, full_lo, full_hi, hi) = {out[first].tolist()}; "
            f"expected [{want[first, 0]}, {want[first, 1]}) and unmasked blocks "
            f"{want[first, 2:].nonzero().flatten().tolist()}"
        )


@pytest.mark.parametrize("name", list(FAMILIES))
def test_query_range_of_a_block_of_keys(name: str, hooks: dict[str, tuple]) -> None:
    """gluon_bwd_range: the query blocks of 64 rows each block of 128 keys meets (every
    alignment of the block of keys)."""
    _, mask, opaque = FAMILIES[name]
    out = torch.full((N - KEYS + 1, 4), -1, dtype=torch.int32)
    with interpreter_library():
        RANGES[(1,)](out, N, RANGE=hooks[name][0], WIDTH=KEYS)
    _check_range(name, out, _kept(mask).T, KEYS, ROWS, opaque)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_key_range_of_a_q_tile(name: str, hooks: dict[str, tuple]) -> None:
    """gluon_bwd_kv_range: the blocks of 64 keys each 128-row Q tile meets."""
    _, mask, opaque = FAMILIES[name]
    out = torch.full((N - TILE + 1, 4), -1, dtype=torch.int32)
    with interpreter_library():
        RANGES[(1,)](out, N, RANGE=hooks[name][1], WIDTH=TILE)
    _check_range(name, out, _kept(mask), TILE, ROWS, opaque)


@pytest.mark.parametrize("name", [n for n, (_, _, opaque) in FAMILIES.items() if not opaque])
def test_masked_block_keeps_what_the_mask_keeps(name: str, hooks: dict[str, tuple]) -> None:
    _, mask, _ = FAMILIES[name]
    p = torch.full((N, N), float("nan"))
    ds = torch.full((N, N), float("nan"))
    with interpreter_library():
        BLOCKS[(N // ROWS, N // ROWS)](p, ds, HOOK=hooks[name][3])
    kept = _kept(mask).T  # [key, query]
    assert torch.equal(p[~kept], torch.zeros_like(p[~kept])) and torch.equal(ds[~kept], torch.zeros_like(ds[~kept]))
    assert torch.equal(p[kept], torch.ones_like(p[kept])), f"{name}: P at kept pairs with S = 0, lse = 0"
    assert (ds[kept] != 0).all() and torch.isfinite(ds[kept]).all(), f"{name}: dS at kept pairs"


@pytest.mark.parametrize("name", [n for n, (_, _, opaque) in FAMILIES.items() if not opaque])  # no extras
@pytest.mark.parametrize("which", ["full", "masked"])
def test_delta_enters_only_as_dp_minus_delta(name: str, which: str, hooks: dict[str, tuple]) -> None:
    """The dK/dV kernel at head dim 128 starts dPᵀ's accumulator at -delta and passes the hook
    0.0 for delta: every hook must then give the same P and dS, bit for bit, on random scores
    (a diagonal block, so the masked hook keeps some pairs and drops others)."""
    g = torch.Generator().manual_seed(0)
    s, dp = torch.randn(64, 64, generator=g) * 4, torch.randn(64, 64, generator=g)
    lse2, delta = torch.randn(64, generator=g) + 8, torch.randn(64, generator=g)
    out = torch.full((4, 64, 64), float("nan"))
    with interpreter_library():
        FOLDED[(1,)](s, dp, lse2, delta, out, HOOK=hooks[name][2 if which == "full" else 3])
    p, ds, p_f, ds_f = out
    assert torch.isfinite(ds).all() and (ds != 0).any(), f"{name}: dS of the block"
    assert torch.equal(p, p_f) and torch.equal(ds, ds_f), f"{name} ({which}): dS changed with delta folded into dP"
