"""The Gluon kernel's generated mask hooks, evaluated on the CPU (issue 20, "Tests").

A module kernel-path gives the sm90 Gluon kernel carries, beside the generic kernel, the
`@triton.jit` functions the Gluon kernel calls for a variant's mask (`gluon_kv_range`, the
KV blocks each 128-row Q tile visits and which of them need no mask; `gluon_score_masked`,
the scores of a masked block). They are plain Triton functions: here a small wrapper kernel
calls them under the interpreter, and their answers are checked against the masks' own
definitions (queries and keys at the same positions, as in the Gluon kernel, Nq = Nk):

- the keys some query of a tile keeps lie in [lo, hi), lo the start of the first block that
  holds one and hi one past the last (kv_segments' bounds: exact for causal, sliding-window
  and prefix-LM masks); an opaque mask (documents) visits up to the tile's causal bound,
  with no unmasked block; for a Q tile at every alignment, so that each window edge falls
  on a block boundary somewhere;
- the blocks [full_lo, full_hi) the Gluon kernel runs without mask code are exactly the whole
  blocks every query of the tile keeps;
- the masked score function keeps exactly the (query, key) pairs the mask keeps (-inf
  elsewhere), on both sides of every diagonal and window edge.

The GPU runs the kernel itself (test_gpu_gluon.py); this checks its hooks where a wrong
bound or edge would otherwise go unnoticed without one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import triton.language as tl
from kernel_harness import variant
from triton.runtime.interpreter import InterpretedFunction

from attnfuse.cache import interpreter_library, load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module

BLOCK = 128  # the Gluon kernel's Q tile and KV block (passes/kernel_path.GLUON_BLOCK)
N = 1024  # keys = queries; a multiple of BLOCK, as the Gluon kernel requires
WINDOW, PREFIX = 300, 639  # neither a multiple of BLOCK; the prefix one key short of 5 blocks

Mask = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""keep(q_pos [M, 1], kv_pos [1, N]) -> bool [M, N]."""


def _causal(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return k <= q


def _window(w: int) -> Mask:
    return lambda q, k: (q - k >= 0) & (q - k < w)


def _prefix(n: int) -> Mask:
    return lambda q, k: (k < n) | (k <= q)


# name -> (score ops, the mask they keep, whether the mask is opaque to causal-split)
FAMILIES: dict[str, tuple[list[str], Mask, bool]] = {
    "causal-softcap": (["attn.softcap {s} cap = 50.0", "attn.mask {s} causal"], _causal, False),
    "window": ([f"attn.mask {{s}} sliding_window({WINDOW})"], _window(WINDOW), False),
    "prefix-lm": ([f"attn.mask {{s}} prefix_lm({PREFIX})"], _prefix(PREFIX), False),
    "causal-and-window": (
        ["attn.mask {s} causal", "attn.mask {s} sliding_window(1000)"],
        lambda q, k: _causal(q, k) & _window(1000)(q, k),
        False,
    ),
    # Documents are opaque: only the causal bound limits the range; the ids are all 0 here,
    # so the tile keeps what causal keeps.
    "document-causal": (["attn.mask {s} causal", "attn.mask {s} document(%ids : tensor<?x?xi32>)"], _causal, True),
}


def _ranges(out, n, RANGE: tl.constexpr):  # noqa: N803 (a constexpr, named as the Gluon kernel names it)
    """out[q_lo] = RANGE(q_lo, q_lo + 127, n), (lo, full_lo, full_hi, hi), for every first
    query position q_lo of a 128-row Q tile inside the n keys (in one vector: the function is
    elementwise)."""
    q_lo = tl.arange(0, 1024)
    ok = q_lo <= n - 128
    zero = tl.zeros_like(q_lo)
    lo, f_lo, f_hi, hi = RANGE(q_lo, q_lo + 127, n)
    tl.store(out + q_lo * 4 + 0, lo + zero, mask=ok)
    tl.store(out + q_lo * 4 + 1, f_lo + zero, mask=ok)
    tl.store(out + q_lo * 4 + 2, f_hi + zero, mask=ok)
    tl.store(out + q_lo * 4 + 3, hi + zero, mask=ok)


def _scores(out, SCORE: tl.constexpr):  # noqa: N803
    """out[tile (i, j)] = SCORE(0, q_idx, kv_idx, 0): the masked score function on zeros."""
    i, j = tl.program_id(0), tl.program_id(1)
    n = tl.num_programs(0) * 128
    rows, cols = i * 128 + tl.arange(0, 128), j * 128 + tl.arange(0, 128)
    s = SCORE(tl.zeros([128, 128], tl.float32), rows[:, None], cols[None, :], 0)
    tl.store(out + rows[:, None] * n + cols[None, :], s)


RANGES = InterpretedFunction(_ranges)
SCORES = InterpretedFunction(_scores)


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> dict[str, tuple]:
    """Each family's (RANGE, SCORE_FULL, SCORE_MASKED): the functions the launcher of its
    generated module (sm 90, loaded for the interpreter) hands the Gluon kernel. With
    `tanh="exact"`: the interpreter runs no inline assembly (the approximate tanh), and the
    masks do not depend on it."""
    folder = Path(tmp_path_factory.mktemp("gluon_kv_range"))
    found = {}
    for name, (ops, _, _) in FAMILIES.items():
        extras = ["%ids: tensor<?x?xi32>"] if "document" in name else []
        ir = variant(dtype=torch.bfloat16, hq=4, hkv=2, d=128, score_ops=ops, extras=extras)
        module = load_source(
            compile_module(parse_module(ir), sm=90, seq_len=4096, tanh="exact").source, folder, interpret=True
        )
        calls: list[dict] = []
        module._gluon_fits = lambda *args: True
        module._gluon_attention = lambda *args, calls=calls, **kwargs: calls.append(kwargs)
        q, k, v = (torch.zeros(1, h, BLOCK, 128, dtype=torch.bfloat16) for h in (4, 2, 2))
        module.launch(q, k, v, *([torch.zeros(1, BLOCK, dtype=torch.int32)] if extras else []))
        ((kwargs,),) = [calls]
        assert kwargs["causal"] is False and kwargs["hooks"][0] is module.gluon_kv_range, f"{name}: {kwargs}"
        found[name] = kwargs["hooks"]
    return found


def _kept(mask: Mask) -> torch.Tensor:
    """[N, N]: whether query position i keeps key position j."""
    pos = torch.arange(N)
    return mask(pos[:, None], pos[None, :])


def _expected(kept: torch.Tensor, opaque: bool) -> torch.Tensor:
    """[N - BLOCK + 1, 2 + N // BLOCK]: for the Q tile of queries q_lo..q_lo + BLOCK - 1, the
    start of the first block holding a key some query keeps, one past the last such key, and
    whether each block is kept whole by every query (never, for an opaque mask)."""
    tiles = kept.unfold(0, BLOCK, 1)  # [q_lo, key, row of the tile]
    some, every = tiles.any(-1), tiles.all(-1)
    keys = torch.arange(N)
    first = torch.where(some, keys, N).min(-1).values
    last = torch.where(some, keys, -1).max(-1).values
    full = every.view(-1, N // BLOCK, BLOCK).all(-1) & (not opaque)
    return torch.cat([(first // BLOCK * BLOCK)[:, None], (last + 1)[:, None], full.long()], 1)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_gluon_kv_range_matches_the_mask(name: str, hooks: dict[str, tuple]) -> None:
    """Every alignment of a Q tile (the Gluon kernel's are multiples of 128; the generic
    kernel's, through the same kv_segments, are shifted by Nk - Nq)."""
    _, mask, opaque = FAMILIES[name]
    out = torch.full((N - BLOCK + 1, 4), -1, dtype=torch.int32)
    with interpreter_library():
        RANGES[(1,)](out, N, RANGE=hooks[name][0])
    lo, f_lo, f_hi, hi = out.long().unbind(1)
    blocks = torch.arange(N // BLOCK)
    full = (blocks >= (f_lo[:, None] + BLOCK - 1) // BLOCK) & (blocks < (f_hi // BLOCK)[:, None])
    got = torch.cat([lo[:, None], hi[:, None], full.long()], 1)
    want = _expected(_kept(mask), opaque)
    ordered = (0 <= lo) & (lo <= f_lo) & (f_lo <= f_hi) & (f_hi <= hi) & (hi <= N)
    for q_lo in (~ordered | (got != want).any(1)).nonzero().flatten().tolist()[:1]:
        raise AssertionError(
            f"{name}, queries {q_lo}..{q_lo + BLOCK - 1} of N = {N}: (lo, full_lo, full_hi, hi) = "
            f"{out[q_lo].tolist()}; expected keys [{want[q_lo, 0]}, {want[q_lo, 1]}) and unmasked blocks "
            f"{want[q_lo, 2:].nonzero().flatten().tolist()}"
        )


@pytest.mark.parametrize("name", [n for n, (_, _, opaque) in FAMILIES.items() if not opaque])
def test_gluon_masked_scores_keep_what_the_mask_keeps(name: str, hooks: dict[str, tuple]) -> None:
    _, mask, _ = FAMILIES[name]
    out = torch.full((N, N), float("nan"))
    with interpreter_library():
        SCORES[(N // BLOCK, N // BLOCK)](out, SCORE=hooks[name][2])
    kept = _kept(mask)
    assert torch.equal(out == float("-inf"), ~kept), f"{name}: the masked score function's -inf pattern"
    assert (out[kept] == 0).all(), f"{name}: kept scores of 0 changed"
