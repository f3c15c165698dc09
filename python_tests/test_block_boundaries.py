"""The block bounds of causal-split, swept over a whole KV block, forward and backward.

causal-split sorts the KV blocks of every Q block into skipped, full (no mask code) and
partial (masked) ones; the bounds between the classes depend on Nk - Nq modulo BLOCK_N.
A bound that is off by one corrupts the output for a single residue only, so each mask
class is run here with every Nk - Nq in 0..BLOCK_N (and a few Nq > Nk), on 16x16 tiles
under the interpreter, against the reference executor.

The backward's two kernels walk the same bounds transposed: the dK/dV kernel's loop over
the Q blocks that meet a KV block (`kv_segments.q_segments`) and the dQ kernel's loop over
KV blocks. The backward sweep runs the residues where a bound can slip (0, 1, 2, the middle,
BLOCK - 2 .. BLOCK + 1, and Nq > Nk) in fp32 on 16x16 tiles, dq, dk and dv against float64
autograd through the reference executor. (A dK/dV kernel whose KV block ended one key early
was wrong only at Nk - Nq = BLOCK - 2: it fails here.)

The FP8 kernels run the forward's residues too, with scale blocks that do and do not tile the
blocks (a key's scale read one row off fails there).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kernel_harness import check, qkv, variant

from attnfuse.cache import interpreter_library, load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.reference import run_reference_with_lse

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
# The backward's residues: both ends of a block and their neighbours, the middle, one block
# and one more, and queries beyond the keys.
BACKWARD_OFFSETS = [0, 1, 2, BLOCK // 2, BLOCK - 2, BLOCK - 1, BLOCK, BLOCK + 1, -1, -(BLOCK - 2)]
GRAD_TOLERANCE = 1e-4
"""max |grad - reference| / max |reference| of fp32 gradients (a slipped bound gives ~1e-2)."""


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
            check(ir, args, kdir, reuse=True, block_m=BLOCK, block_n=BLOCK)
        except AssertionError as e:
            raise AssertionError(f"{name}: Nq={nq}, Nk={nq + offset} (Nk - Nq = {offset})\n{e}") from e


def _backward_kernels(ir: str, folder: Path):
    """The backward (dq, dk, dv) module of `ir` on BLOCK x BLOCK tiles (its LAUNCH_PARAMS say
    so), for the interpreter."""
    source = compile_module(parse_module(ir), sm=0, block_m=BLOCK, block_n=BLOCK, direction="bwd", wrt=(0, 1, 2))
    module = load_source(source.source, folder, interpret=True)
    for name in ("attn_bwd_dkdv", "attn_bwd_dq"):
        tiles = module.LAUNCH_PARAMS[name]["constexprs"]
        assert tiles == {"BLOCK_M": str(BLOCK), "BLOCK_N": str(BLOCK)}, f"{name}'s tiles: {tiles}"
    return module


def _check_gradients(bwd, ir: str, args: list[torch.Tensor]) -> None:
    """The backward kernel's dq, dk, dv against float64 autograd through the reference executor,
    by their largest error relative to the largest reference value, so that a single wrong row
    shows. The kernel reads the reference's out and lse (the forward sweep checks the forward
    kernel's), rounded to fp32."""
    dout = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(7))
    xs = [a.double().requires_grad_() for a in args]
    ref, lse = run_reference_with_lse(ir, *xs)
    refs = torch.autograd.grad(ref, xs, dout.double())
    with interpreter_library():
        grads = bwd.launch(*args, ref.detach().float(), lse.detach().float(), dout)
    for what, got, want in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        err = (got.double() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        assert err <= GRAD_TOLERANCE, f"{what}: max error {err:.2e} of the largest value (tolerance {GRAD_TOLERANCE})"


@pytest.mark.parametrize("name", list(MASK_CLASSES))
def test_backward_at_every_bound_residue(kdir, name):
    ir = variant(dtype=torch.float32, d=16, hq=1, hkv=1, score_ops=MASK_CLASSES[name])
    bwd = _backward_kernels(ir, kdir)
    nq = BLOCK + 3  # two Q blocks, the second partial
    for offset in BACKWARD_OFFSETS:
        args = qkv(hq=1, hkv=1, d=16, nq=nq, nk=nq + offset, dtype=torch.float32, seed=offset + 200)
        try:
            _check_gradients(bwd, ir, args)
        except AssertionError as e:
            raise AssertionError(f"{name}: Nq={nq}, Nk={nq + offset} (Nk - Nq = {offset})\n{e}") from e


# The FP8 kernels (kernel path `fp8`): q and k quantized with scale blocks that do and do not
# tile the 16-row blocks (gathered per row and key), the same residues as the forward sweep. V
# stays fp32, so the kernel reproduces the reference's e4m3 values and its output to fp32 rounding.
FP8_CLASSES = {
    "causal-blocks-8-24": ("8", "24", MASK_CLASSES["causal"]),
    "window-per-tensor-16": ("0", "16", MASK_CLASSES["window_wide"]),
    "custom-causal-32-per-tensor": ("32", "0", MASK_CLASSES["custom_causal"]),
}


@pytest.mark.parametrize("name", list(FP8_CLASSES))
def test_fp8_every_offset_within_a_block(kdir, name):
    q_block, k_block, score_ops = FP8_CLASSES[name]
    ir = variant(
        dtype=torch.float32,
        d=16,
        hq=2,
        hkv=1,
        q_ops=[f"attn.quantize {{x}} e4m3 block = {q_block}"],
        k_ops=[f"attn.quantize {{x}} e4m3 block = {k_block}"],
        score_ops=score_ops,
    )
    nq = 2 * BLOCK + 3
    for offset in OFFSETS:
        args = qkv(hq=2, hkv=1, d=16, nq=nq, nk=nq + offset, dtype=torch.float32, seed=offset + 300)
        try:
            source = check(ir, args, kdir, atol=1e-5, reuse=True, block_m=BLOCK, block_n=BLOCK)
        except AssertionError as e:
            raise AssertionError(f"{name}: Nq={nq}, Nk={nq + offset} (Nk - Nq = {offset})\n{e}") from e
    assert "def quantize_q(" in source
