"""The block bounds of causal-split, swept over a whole KV block.

causal-split sorts the KV blocks of every Q block into skipped, full (no mask code) and
partial (masked) ones; the bounds between the classes depend on Nk - Nq modulo BLOCK_N.
A bound that is off by one corrupts the output for a single residue only, so each mask
class is run here with every Nk - Nq in 0..BLOCK_N (and a few Nq > Nk), on 16x16 tiles
under the interpreter, against the reference executor.
"""

from __future__ import annotations

import pytest
from kernel_harness import check, qkv, variant

BLOCK = 16
CUSTOM_CAUSAL = (
    "attn.mask {s} custom {\n  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):\n"
    "    %le = arith.cmpi sle, %ki, %qi : i32\n    attn.yield %le : i1\n  }"
)
MASK_CLASSES = {
    "causal": ["attn.mask {s} causal"],
    "window_narrow": ["attn.mask {s} sliding_window(5)"],
    "window_wide": ["attn.mask {s} sliding_window(21)"],
    "window_block": [f"attn.mask {{s}} sliding_window({BLOCK})"],
    "prefix_lm": ["attn.mask {s} prefix_lm(7)"],
    "causal_and_window": ["attn.mask {s} causal", "attn.mask {s} sliding_window(18)"],
    "custom_causal": [CUSTOM_CAUSAL],
}
# Nk - Nq over a whole block (both ends: 0 and BLOCK), then queries beyond the keys.
OFFSETS = [*range(BLOCK + 1), -1, -(BLOCK - 2)]


@pytest.fixture(scope="module")
def kdir(tmp_path_factory):
    return tmp_path_factory.mktemp("boundaries")


@pytest.mark.parametrize("name", list(MASK_CLASSES))
def test_every_offset_within_a_block(kdir, name):
    ir = variant(d=16, hq=1, hkv=1, score_ops=MASK_CLASSES[name])
    nq = 2 * BLOCK + 3
    for offset in OFFSETS:
        args = qkv(hq=1, hkv=1, d=16, nq=nq, nk=nq + offset, seed=offset + 100)
        try:
            check(ir, args, kdir, block_m=BLOCK, block_n=BLOCK)
        except AssertionError as e:
            raise AssertionError(f"{name}: Nq={nq}, Nk={nq + offset} (Nk - Nq = {offset})\n{e}") from e
