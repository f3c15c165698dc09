"""Generated Triton kernels, run under the interpreter on CPU, against the reference
executor (attnfuse.reference) in float64 on the same inputs.

Every test compiles attn IR with `compile_module(..., sm=0)` (the interpreter's tiles,
32 x 32 unless a test sets them), imports the generated source and compares both
outputs of `launch`: the attention output and the natural-log log-sum-exp of each
row. Inputs are fp16 or fp32 (bf16 `tl.dot` is wrong under Triton 3.6's
interpreter). Shapes stay small: the interpreter runs every program in Python.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_harness import CUSTOM_MASK, SCORE_MOD, check, qkv, run_kernel, variant

from attnfuse.reference import run_reference_with_lse

# An empty row's log-sum-exp is log2(0) = -inf by design; numpy warns about it.
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")

F16, F32 = torch.float16, torch.float32
CAUSAL = "attn.mask {s} causal"


@pytest.fixture(scope="module")
def kdir(tmp_path_factory):
    """Where the generated sources are written (triton.jit needs real files)."""
    return tmp_path_factory.mktemp("kernels")


def rope(style: str = "half", rotary_dim: int = 32, extra: str = "") -> str:
    return f"attn.rope {{x}} {style} theta = 10000.0 rotary_dim = {rotary_dim}{extra}"


def weights(n: int, dtype=F16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g) + 0.5).to(dtype)


# ----------------------------------------------------------------------------- regions


# A per-head table of relative-distance biases, read with attn.extract.
CUSTOM_BIAS = """attn.bias {s} custom(%tb : tensor<2x?xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<2x?xf32>):
    %d = arith.subi %qi, %ki : i32
    %ad = math.absi %d : i32
    %val = attn.extract %t[%h, %ad] : tensor<2x?xf32>
    attn.yield %val : f32
  }"""


# |x|: turns a masked -inf into +inf if a mask were applied before it.
ABS_SCORE = """attn.score_mod {s} {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %a = math.absf %x : f32
    attn.yield %a : f32
  }"""

# Strictly causal: the first query has no key at all.
STRICT_CAUSAL = """attn.mask {s} custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %lt = arith.cmpi slt, %ki, %qi : i32
    attn.yield %lt : i1
  }"""

# Integer division and remainders of negative numbers (C semantics for divsi/remsi,
# rounding down for floordivsi), xor of booleans.
DIVISIONS = """attn.mask {s} custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %d = arith.subi %ki, %qi : i32
    %c5 = arith.constant 5 : i32
    %m1 = arith.constant -1 : i32
    %fd = arith.floordivsi %d, %c5 : i32
    %dd = arith.divsi %d, %c5 : i32
    %rr = arith.remsi %d, %c5 : i32
    %c1 = arith.cmpi sge, %fd, %m1 : i32
    %c2 = arith.cmpi ne, %dd, %m1 : i32
    %c3 = arith.cmpi ne, %rr, %m1 : i32
    %x = arith.xori %c2, %c3 : i1
    %keep = arith.andi %c1, %x : i1
    attn.yield %keep : i1
  }"""


# ----------------------------------------------------------------------------- each op alone


def _alone(dtype):
    """(name, variant kwargs, extra arguments) for each building block on its own."""
    f = dtype
    return [
        ("qk_softmax_pv", {}, []),
        ("qk_scale", {"qk": "scale = 0.3"}, []),
        ("rope", {"q_ops": [rope()], "k_ops": [rope()]}, []),
        ("norm", {"q_ops": ["attn.norm {x} eps = 1.0e-06"], "k_ops": ["attn.norm {x} eps = 1.0e-05"]}, []),
        (
            "norm_weight",
            {
                "q_ops": ["attn.norm {x} eps = 1.0e-06 weight(%w : tensor<32x{E}>)"],
                "extras": ["%w: tensor<32x{E}>"],
            },
            [weights(32, f)],
        ),
        ("scale_pre", {"q_ops": ["attn.scale {x} value = 0.5"], "k_ops": ["attn.scale {x} value = 3.0"]}, []),
        ("scale_post", {"score_ops": ["attn.scale {s} value = 1.7"]}, []),
        ("mask", {"score_ops": [CAUSAL]}, []),
        (
            "bias_alibi",
            {"score_ops": ["attn.bias {s} alibi(%sl : tensor<2xf32>)"], "extras": ["%sl: tensor<2xf32>"]},
            [torch.tensor([0.5, 0.125])],
        ),
        ("bias_custom", {"score_ops": [CUSTOM_BIAS], "extras": ["%tb: tensor<2x?xf32>"]}, [torch.randn(2, 40)]),
        ("softcap", {"score_ops": ["attn.softcap {s} cap = 2.0"]}, []),
        ("score_mod", {"score_ops": [SCORE_MOD]}, []),
        (
            "softmax_sink",
            {"softmax": "sink(%sk : tensor<2xf32>)", "extras": ["%sk: tensor<2xf32>"]},
            [torch.tensor([0.5, 4.0])],
        ),
    ]


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
@pytest.mark.parametrize("case", range(len(_alone(F16))), ids=[c[0] for c in _alone(F16)])
def test_each_op_alone(kdir, dtype, case):
    _, kwargs, extras = _alone(dtype)[case]
    check(variant(dtype=dtype, **kwargs), qkv(dtype=dtype) + extras, kdir, rope_mode="fused")


# ----------------------------------------------------------------------------- RoPE + causal


ROPES = {
    "half": rope("half"),
    "interleaved": rope("interleaved"),
    "partial_half": rope("half", 16),
    "partial_interleaved": rope("interleaved", 16),
    "llama3": rope(extra=" scaling = #attn.rope_scaling<llama3, factor = 8.0, original_max_position = 32.0>"),
    "yarn": rope(
        extra=" scaling = #attn.rope_scaling<yarn, factor = 4.0, original_max_position = 16.0, attention_factor = 1.25>"
    ),
}


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
@pytest.mark.parametrize("style", list(ROPES))
def test_rope_causal(kdir, style, mode):
    """The paper's variant: RoPE on q and k, causal, GQA; both placements of K's rotation."""
    ir = variant(hq=4, hkv=2, q_ops=[ROPES[style]], k_ops=[ROPES[style]], score_ops=[CAUSAL])
    source = check(ir, qkv(hq=4, hkv=2, nq=70), kdir, rope_mode=mode)
    assert ("def rotate_k(" in source) == (mode == "prerotate")


# q's and k's ropes need not agree: each tile is rotated on its own before the dot.
ROPE_PAIRS = {
    "half_interleaved": (rope("half"), rope("interleaved")),
    "interleaved_half_16": (rope("interleaved"), rope("half", 16)),
    "partial_q_only": (rope("half", 16), None),
    "k_only": (None, rope("interleaved", 16, " scaling = #attn.rope_scaling<linear, factor = 2.0>")),
}


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
@pytest.mark.parametrize("pair", list(ROPE_PAIRS))
def test_q_and_k_ropes_of_different_layouts(kdir, pair, mode):
    q_rope, k_rope = ROPE_PAIRS[pair]
    ir = variant(q_ops=[q_rope] if q_rope else [], k_ops=[k_rope] if k_rope else [], score_ops=[CAUSAL])
    check(ir, qkv(nq=40, nk=50), kdir, rope_mode=mode)


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
def test_rope_causal_f32(kdir, mode):
    ir = variant(dtype=F32, hq=4, hkv=2, q_ops=[rope()], k_ops=[rope()], score_ops=[CAUSAL])
    check(ir, qkv(dtype=F32, hq=4, hkv=2, nq=50), kdir, rope_mode=mode)


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
def test_rope_inv_freq_operand_strided(kdir, mode):
    """inv_freq given as a tensor (here a strided view) instead of theta and scaling."""
    r = rope(extra=" inv_freq(%f : tensor<16xf32>)")
    ir = variant(q_ops=[r], k_ops=[r], score_ops=[CAUSAL], extras=["%f: tensor<16xf32>"])
    freqs = torch.rand(32, generator=torch.Generator().manual_seed(3))[::2]
    check(ir, qkv() + [freqs], kdir, rope_mode=mode)


def test_argument_names_that_shadow_the_generated_code(kdir):
    """Function arguments named like builtins or names the generated module uses (`max` is
    called in launch(), `torch` imported) are renamed in the launcher, not shadowed."""
    ir = variant(q_ops=[rope()], k_ops=[rope()], score_ops=[CAUSAL])
    ir = ir.replace("%q", "%max").replace("%v", "%torch")
    source = check(ir, qkv(nq=45), kdir, rope_mode="prerotate")
    assert "def launch(max_0, k, torch_2, *, lse=None):" in source


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
def test_qk_norm_weight_then_rope(kdir, mode):
    """Qwen3: QK-norm with learned weights, then RoPE, causal."""
    ir = variant(
        q_ops=["attn.norm {x} eps = 1.0e-06 weight(%qw : tensor<32x{E}>)", rope()],
        k_ops=["attn.norm {x} eps = 1.0e-06 weight(%kw : tensor<32x{E}>)", rope()],
        score_ops=[CAUSAL],
        extras=["%qw: tensor<32x{E}>", "%kw: tensor<32x{E}>"],
    )
    check(ir, qkv(nq=45) + [weights(32, seed=1), weights(32, seed=2)], kdir, rope_mode=mode)


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
def test_rope_then_norm_and_scale(kdir, mode):
    """Transforms after the rotation, on partial rotary: they see rotated channels."""
    ir = variant(
        q_ops=[rope(rotary_dim=16), "attn.norm {x} eps = 1.0e-06", "attn.scale {x} value = 2.0"],
        k_ops=[rope(rotary_dim=16), "attn.norm {x} eps = 1.0e-06"],
        score_ops=[CAUSAL],
    )
    check(ir, qkv(), kdir, rope_mode=mode)


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
def test_rope_more_queries_than_keys(kdir, mode):
    """Nq > Nk: the first queries sit at negative positions (rotation by -angle)."""
    ir = variant(q_ops=[rope()], k_ops=[rope()])
    check(ir, qkv(nq=50, nk=20), kdir, rope_mode=mode)


# ----------------------------------------------------------------------------- masks


def doc_ids(b: int, n: int, seed: int = 0) -> torch.Tensor:
    """Document ids [b, n]: runs of random lengths."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(b, n, generator=g) < 0.08).cumsum(1).to(torch.int32)


MASKS = {
    "sliding_window": (["attn.mask {s} sliding_window(20)"], 100),
    "prefix_lm": (["attn.mask {s} prefix_lm(37)"], 100),
    "causal_and_window": ([CAUSAL, "attn.mask {s} sliding_window(40)"], 100),
    "prefix_and_window": (["attn.mask {s} prefix_lm(21)", "attn.mask {s} sliding_window(17)"], 100),
    "custom_region_causal": (
        [
            "attn.mask {s} custom {\n  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):\n"
            "    %le = arith.cmpi sle, %ki, %qi : i32\n    attn.yield %le : i1\n  }"
        ],
        70,
    ),
}


@pytest.mark.parametrize("name", list(MASKS))
def test_masks(kdir, name):
    score_ops, n = MASKS[name]
    check(variant(score_ops=score_ops), qkv(nq=n), kdir)


@pytest.mark.parametrize("name", ["sliding_window", "prefix_lm"])
def test_masks_f32(kdir, name):
    score_ops, n = MASKS[name]
    check(variant(dtype=F32, score_ops=score_ops), qkv(dtype=F32, nq=n), kdir)


@pytest.mark.parametrize("block_m, block_n", [(16, 16), (16, 64), (64, 16)], ids=["16x16", "16x64", "64x16"])
@pytest.mark.parametrize(
    "masks",
    [["attn.mask {s} sliding_window(7)"], ["attn.mask {s} prefix_lm(21)", "attn.mask {s} sliding_window(17)"]],
    ids=["window", "prefix_and_window"],
)
def test_block_classes_with_other_tiles(kdir, masks, block_m, block_n):
    """The skipped / full / partial segment bounds for tiles of unequal sizes, with Nq < Nk."""
    check(variant(score_ops=masks), qkv(nq=37, nk=101), kdir, block_m=block_m, block_n=block_n)


@pytest.mark.parametrize("masks", [[CAUSAL], ["attn.mask {s} sliding_window(17)"]], ids=["causal", "window"])
def test_without_causal_split(kdir, masks):
    """causal-split=false (the ablation's baseline): one loop over every KV block, all
    masked, gives the same attention."""
    check(variant(score_ops=masks), qkv(nq=37, nk=70), kdir, causal_split=False)


def test_document_mask(kdir):
    ir = variant(score_ops=["attn.mask {s} document(%ids : tensor<?x?xi32>)"], extras=["%ids: tensor<?x?xi32>"])
    check(ir, qkv(b=2, nq=70) + [doc_ids(2, 70)], kdir)


def test_document_causal_fewer_queries_i64_ids(kdir):
    ir = variant(score_ops=[CAUSAL, "attn.mask {s} document(%ids : tensor<?x?xi64>)"], extras=["%ids: tensor<?x?xi64>"])
    check(ir, qkv(b=2, nq=25, nk=70) + [doc_ids(2, 70).long()], kdir)


def test_two_document_masks(kdir):
    """Each document mask compares against its own ids (a conjunction of two packings)."""
    ir = variant(
        score_ops=["attn.mask {s} document(%i1 : tensor<?x?xi32>)", "attn.mask {s} document(%i2 : tensor<?x?xi32>)"],
        extras=["%i1: tensor<?x?xi32>", "%i2: tensor<?x?xi32>"],
    )
    check(ir, qkv(nq=70) + [doc_ids(1, 70, seed=1), doc_ids(1, 70, seed=2)], kdir)


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_custom_region_mask(kdir, dtype):
    """%, comparisons, |, & and attn.extract of an extra tensor, lowered to tile code."""
    flags = (torch.arange(50) % 7 == 0).to(torch.int32)
    ir = variant(dtype=dtype, score_ops=[CUSTOM_MASK], extras=["%t: tensor<?xi32>"])
    check(ir, qkv(dtype=dtype, nq=50) + [flags], kdir)


@pytest.mark.parametrize(
    "after",
    ["attn.softcap {s} cap = 5.0", ABS_SCORE, "attn.bias {s} alibi(%sl : tensor<2xf32>)"],
    ids=["softcap", "score_mod_abs", "alibi"],
)
def test_mask_before_other_score_ops(kdir, after):
    """A masked score stays masked whatever score ops follow the mask."""
    extras = ["%sl: tensor<2xf32>"] if "alibi" in after else []
    args = qkv() + ([torch.tensor([0.5, 0.25])] if extras else [])
    check(variant(score_ops=[CAUSAL, after], extras=extras), args, kdir)


def _mask_region(body: str, extra_args: str = "", extras: str = "") -> str:
    head = "attn.mask {s} custom" + (f"({extras})" if extras else "")
    return head + " {\n  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32" + extra_args + "):\n" + body + "\n  }"


REGIONS = {
    # Booleans in arithmetic are zero-extended (what the DSL emits for `(q >= k) * 2`).
    "extui_bool": _mask_region(
        "    %le = arith.cmpi sle, %ki, %qi : i32\n    %e = arith.extui %le : i1 to i32\n"
        "    %z = arith.constant 0 : i32\n    %keep = arith.cmpi sgt, %e, %z : i32\n    attn.yield %keep : i1"
    ),
    # A signed i1 true is -1, as an integer and as a float.
    "extsi_sitofp_bool": _mask_region(
        "    %le = arith.cmpi sle, %ki, %qi : i32\n    %e = arith.extsi %le : i1 to i32\n"
        "    %f = arith.sitofp %le : i1 to f32\n    %z = arith.constant 0 : i32\n    %zf = arith.constant 0.0 : f32\n"
        "    %a = arith.cmpi slt, %e, %z : i32\n    %c = arith.cmpf olt, %f, %zf : f32\n"
        "    %keep = arith.andi %a, %c : i1\n    attn.yield %keep : i1"
    ),
    # Unsigned compare: q_idx - kv_idx < 5 as unsigned keeps only 0 <= distance < 5.
    "unsigned_compare": _mask_region(
        "    %d = arith.subi %qi, %ki : i32\n    %c5 = arith.constant 5 : i32\n"
        "    %keep = arith.cmpi ult, %d, %c5 : i32\n    attn.yield %keep : i1"
    ),
    # i64 arithmetic after sign extension; not written as xor with true.
    "i64_and_not": _mask_region(
        "    %q64 = arith.extsi %qi : i32 to i64\n    %k64 = arith.extsi %ki : i32 to i64\n"
        "    %d = arith.subi %q64, %k64 : i64\n    %c = arith.constant 10 : i64\n"
        "    %far = arith.cmpi sge, %d, %c : i64\n    %true = arith.constant true\n"
        "    %near = arith.xori %far, %true : i1\n    %past = arith.cmpi sge, %d, %c0 : i64\n"
        "    %keep = arith.andi %near, %past : i1\n    attn.yield %keep : i1"
    )
    .replace("%c0 : i64", "%zero : i64")
    .replace("    %d = arith.subi", "    %zero = arith.constant 0 : i64\n    %d = arith.subi"),
    "divisions": DIVISIONS,
}


@pytest.mark.parametrize("name", list(REGIONS))
def test_region_integer_semantics(kdir, name):
    """Region integer ops follow MLIR's semantics in the kernel, as in the reference."""
    check(variant(score_ops=[REGIONS[name]]), qkv(), kdir)


def test_padding_mask_from_lengths(kdir):
    """A key-padding mask: kv_idx < lengths[b], a scalar attn.extract indexed by the batch."""
    mask = _mask_region(
        "    %len = attn.extract %L[%b] : tensor<?xi32>\n    %keep = arith.cmpi slt, %ki, %len : i32\n"
        "    attn.yield %keep : i1",
        ", %L: tensor<?xi32>",
        "%lens : tensor<?xi32>",
    )
    ir = variant(score_ops=[mask], extras=["%lens: tensor<?xi32>"])
    check(ir, qkv(b=3, nq=40) + [torch.tensor([40, 13, 1], dtype=torch.int32)], kdir)


# ----------------------------------------------------------------------------- score mods


# Leaky scores through cmpf/select and float math ops, times a per-head weight.
FLOAT_SCORE_MOD = """attn.score_mod {s} (%w : tensor<2xf32>) {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32, %wt: tensor<2xf32>):
    %z = arith.constant 0.0 : f32
    %c = arith.constant 0.1 : f32
    %pos = arith.cmpf ogt, %x, %z : f32
    %y = arith.mulf %x, %c : f32
    %r = arith.select %pos, %x, %y : f32
    %e = math.exp %r : f32
    %l = math.log %e : f32
    %sq = math.sqrt %e : f32
    %m = arith.maximumf %l, %sq : f32
    %ng = arith.negf %m : f32
    %p = math.powf %e, %c : f32
    %sum = arith.addf %ng, %p : f32
    %wh = attn.extract %wt[%h] : tensor<2xf32>
    %out = arith.mulf %sum, %wh : f32
    attn.yield %out : f32
  }"""


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_float_score_mod(kdir, dtype):
    ir = variant(dtype=dtype, score_ops=[FLOAT_SCORE_MOD, CAUSAL], extras=["%w: tensor<2xf32>"])
    check(ir, qkv(dtype=dtype) + [torch.tensor([0.5, 2.0])], kdir)


def test_f16_bias_table(kdir):
    bias = """attn.bias {s} custom(%tb : tensor<2x?xf16>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<2x?xf16>):
    %val = attn.extract %t[%h, %ki] : tensor<2x?xf16>
    %vf = arith.extf %val : f16 to f32
    attn.yield %vf : f32
  }"""
    ir = variant(score_ops=[bias, CAUSAL], extras=["%tb: tensor<2x?xf16>"])
    check(ir, qkv() + [torch.randn(2, 40).half()], kdir)


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_softcap_sliding_window(kdir, dtype):
    """Gemma 2's local layer: softcap (so log2 e is not folded into q), sliding window."""
    ir = variant(dtype=dtype, score_ops=["attn.softcap {s} cap = 3.0", "attn.mask {s} sliding_window(24)"])
    check(ir, qkv(dtype=dtype, nq=80), kdir)


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_alibi_causal_gqa(kdir, dtype):
    ir = variant(
        dtype=dtype,
        hq=4,
        hkv=2,
        score_ops=["attn.bias {s} alibi(%sl : tensor<4xf32>)", CAUSAL],
        extras=["%sl: tensor<4xf32>"],
    )
    slopes = torch.tensor([2.0 ** (-8 * (i + 1) / 4) for i in range(4)])
    check(ir, qkv(dtype=dtype, hq=4, hkv=2, nq=60) + [slopes], kdir)


def test_custom_bias_and_score_mod_causal(kdir):
    ir = variant(score_ops=[CUSTOM_BIAS, SCORE_MOD, CAUSAL], extras=["%tb: tensor<2x?xf32>"])
    check(ir, qkv(nq=40) + [torch.randn(40, 2).t()], kdir)  # a transposed (strided) table


# ----------------------------------------------------------------------------- sinks, empty rows


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_sink_sliding_window(kdir, dtype):
    """gpt-oss: a learned sink logit per head, sliding window; softcap-free, so log2 e folded."""
    ir = variant(
        dtype=dtype,
        score_ops=["attn.mask {s} sliding_window(16)"],
        softmax="sink(%sk : tensor<2x{E}>)",
        extras=["%sk: tensor<2x{E}>"],
    )
    check(ir, qkv(dtype=dtype, nq=60) + [torch.tensor([0.5, 3.0]).to(dtype)], kdir)


def test_sink_with_softcap_and_scale(kdir):
    ir = variant(
        dtype=F32,
        score_ops=["attn.softcap {s} cap = 3.0", "attn.scale {s} value = 2.0", CAUSAL],
        softmax="sink(%sk : tensor<2xf32>)",
        extras=["%sk: tensor<2xf32>"],
    )
    check(ir, qkv(dtype=F32) + [torch.tensor([0.5, 3.0])], kdir)


def test_fully_masked_rows_give_zeros(kdir):
    """A strictly causal window: the first query keeps no key, so its row is 0 and its
    log-sum-exp -inf (no NaN); the other rows are unaffected."""
    ir = variant(score_ops=["attn.mask {s} sliding_window(8)", STRICT_CAUSAL])
    args = qkv(b=2, nq=40)
    out, lse, _ = run_kernel(ir, args, kdir)
    ref, ref_lse = run_reference_with_lse(ir, *args)
    assert torch.all(ref[:, :, 0] == 0) and torch.all(torch.isneginf(ref_lse[:, :, 0]))
    assert torch.all(out[:, :, 0] == 0) and torch.all(torch.isneginf(lse[:, :, 0]))
    assert not out.isnan().any()
    check(ir, args, kdir)


def test_fully_masked_rows_with_sink(kdir):
    """With a sink, an empty row is still 0, and its log-sum-exp is the sink logit."""
    ir = variant(
        score_ops=["attn.mask {s} sliding_window(8)", STRICT_CAUSAL],
        softmax="sink(%sk : tensor<2xf32>)",
        extras=["%sk: tensor<2xf32>"],
    )
    sinks = torch.tensor([0.5, -3.0])
    args = qkv(b=2, nq=40) + [sinks]
    out, lse, _ = run_kernel(ir, args, kdir)
    assert torch.all(out[:, :, 0] == 0)
    torch.testing.assert_close(lse[:, :, 0], sinks.expand(2, 2), rtol=0, atol=1e-5)
    check(ir, args, kdir)


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    "nq, nk", [(45, 45), (77, 77), (1, 77), (20, 70), (50, 20)], ids=["n45", "n77", "decode", "nq_lt_nk", "nq_gt_nk"]
)
def test_lengths(kdir, nq, nk):
    """N not a multiple of the tiles, decode (Nq = 1), Nq < Nk and Nq > Nk, causal."""
    check(variant(score_ops=[CAUSAL]), qkv(nq=nq, nk=nk), kdir)


@pytest.mark.parametrize(
    "hq, hkv, nq, nk", [(4, 2, 40, 40), (4, 1, 1, 77), (6, 3, 17, 50)], ids=["gqa_4_2", "mqa_decode", "gqa_6_3"]
)
def test_gqa(kdir, hq, hkv, nq, nk):
    check(variant(hq=hq, hkv=hkv, score_ops=[CAUSAL]), qkv(hq=hq, hkv=hkv, nq=nq, nk=nk), kdir)


@pytest.mark.parametrize(
    "d, dv", [(16, 16), (80, 80), (128, 128), (32, 16), (32, 48)], ids=["d16", "d80", "d128", "dv16", "dv48"]
)
def test_head_dims(kdir, d, dv):
    """Head dims padded to powers of two with masks, and a value head dim != qk's."""
    check(variant(d=d, dv=dv, score_ops=[CAUSAL]), qkv(d=d, dv=dv, nq=45), kdir)


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
def test_rope_head_dim_80(kdir, mode):
    """A non-power-of-two head dim with RoPE: the pair partners of padded channels."""
    ir = variant(hq=4, hkv=2, d=80, q_ops=[rope(rotary_dim=80)], k_ops=[rope(rotary_dim=80)], score_ops=[CAUSAL])
    check(ir, qkv(hq=4, hkv=2, d=80, nq=50), kdir, rope_mode=mode)


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
def test_rope_head_dim_16_partial_interleaved_80(kdir, mode):
    check(
        variant(d=16, q_ops=[rope(rotary_dim=16)], k_ops=[rope(rotary_dim=16)], score_ops=[CAUSAL]),
        qkv(d=16),
        kdir,
        rope_mode=mode,
    )
    check(
        variant(d=80, q_ops=[rope("interleaved", 48)], k_ops=[rope("interleaved", 48)], score_ops=[CAUSAL]),
        qkv(d=80),
        kdir,
        rope_mode=mode,
    )


def bshd(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The same values stored [B, N, H, D] and viewed as [B, H, N, D] (non-contiguous)."""
    return [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors]


@pytest.mark.parametrize("mode", ["fused", "prerotate"])
def test_strided_inputs(kdir, mode):
    """Transposed views, as a [B, N, H, D] model layout gives; strides are kernel arguments."""
    q, k, v = bshd(*qkv(b=2, hq=4, hkv=2, nq=40))
    assert not q.is_contiguous()
    ir = variant(hq=4, hkv=2, q_ops=[rope()], k_ops=[rope()], score_ops=[CAUSAL])
    check(ir, [q, k, v], kdir, rope_mode=mode)


def test_sliced_and_broadcast_inputs(kdir):
    """Slices of the head dim (channel stride 2, offset views) and a batch-broadcast K/V
    (batch stride 0)."""
    q, k, v = qkv(b=2, d=64, nq=40)
    check(variant(score_ops=[CAUSAL]), [q[..., :32], k[..., 32:], v[..., ::2]], kdir)
    k1, v1 = qkv(b=1, nq=40, seed=5)[1:]
    check(variant(score_ops=[CAUSAL]), [qkv(b=2, nq=40)[0], k1.expand(2, -1, -1, -1), v1.expand(2, -1, -1, -1)], kdir)


def test_lse_is_the_logsumexp_of_the_scores(kdir):
    """The lse output against a logsumexp computed here from the scores themselves."""
    q, k, v = qkv(dtype=F32, nq=30, nk=50)
    ir = variant(dtype=F32, score_ops=[CAUSAL])
    _, lse, _ = run_kernel(ir, [q, k, v], kdir)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(32)
    q_pos = torch.arange(20, 50)[:, None]
    s = s.masked_fill(torch.arange(50)[None, :] > q_pos, float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, dim=-1), rtol=0, atol=1e-4)


def test_mask_and_bias_tensors(kdir):
    """flex-style extra tensors read per score: a boolean [Nq, Nk] mask (a strided view)
    and a [B, H, Nq, Nk] bias broadcast over batch and heads (strides 0)."""
    mask = """attn.mask {s} custom(%M : tensor<?x?xi1>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %m: tensor<?x?xi1>):
    %keep = attn.extract %m[%qi, %ki] : tensor<?x?xi1>
    attn.yield %keep : i1
  }"""
    bias = """attn.bias {s} custom(%B : tensor<?x?x?x?xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %bb: tensor<?x?x?x?xf32>):
    %val = attn.extract %bb[%b, %h, %qi, %ki] : tensor<?x?x?x?xf32>
    attn.yield %val : f32
  }"""
    g = torch.Generator().manual_seed(4)
    keep = torch.rand(40, 40, generator=g) < 0.7
    ir = variant(score_ops=[bias, mask], extras=["%B: tensor<?x?x?x?xf32>", "%M: tensor<?x?xi1>"])
    table = torch.randn(1, 1, 40, 40, generator=g).expand(2, 2, 40, 40)
    check(ir, qkv(b=2) + [table, keep.t().contiguous().t()], kdir)
