"""The reference executor (attnfuse.reference) against plain PyTorch formulas.

Every expected value here is computed independently of the executor: masks and biases
by Python loops over positions, RoPE by HF's rotate_half form and Meta's complex form,
softmax by torch.softmax, and, where it applies, torch's scaled_dot_product_attention.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnfuse.errors import AttnFuseError
from attnfuse.ir import get_func, parse_module
from attnfuse.reference import run_reference, run_reference_with_lse

F64 = torch.float64
NEG_INF = float("-inf")


def variant(body: str, *, hq: int = 2, hkv: int = 2, d: int = 16, dv: int | None = None, extras: str = "") -> str:
    """A `func.func @f(%q, %k, %v{extras})` around `body`, which must define `%o`. In
    `body`, {QT}/{KT}/{VT} are the q/k/v types, {S}/{P} the scores/probs types, {OT} the
    output type."""
    dv = d if dv is None else dv
    types = {
        "QT": f"tensor<?x{hq}x?x{d}xf32>",
        "KT": f"tensor<?x{hkv}x?x{d}xf32>",
        "VT": f"tensor<?x{hkv}x?x{dv}xf32>",
        "S": f"!attn.scores<{hq}>",
        "P": f"!attn.probs<{hq}>",
        "OT": f"tensor<?x{hq}x?x{dv}xf32>",
    }
    for key, t in types.items():
        body = body.replace("{" + key + "}", t)
    sig = f"%q: {types['QT']}, %k: {types['KT']}, %v: {types['VT']}{extras}"
    return f"func.func @f({sig}) -> {types['OT']} {{\n{body}\n  func.return %o : {types['OT']}\n}}\n"


# The common tail: softmax of %m, then pv.
TAIL = """
  %p = attn.softmax %m : {S} -> {P}
  %o = attn.pv %p, %v : {P}, {VT} -> {OT}"""

PLAIN_IR = variant("  %m = attn.qk %q, %k : {QT}, {KT} -> {S}" + TAIL)
CAUSAL_IR = variant("  %s = attn.qk %q, %k : {QT}, {KT} -> {S}\n  %m = attn.mask %s causal : {S}" + TAIL)


def qkv(b=2, hq=2, hkv=2, nq=16, nk=16, d=16, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    return (
        torch.randn(b, hq, nq, d, generator=g, dtype=F64),
        torch.randn(b, hkv, nk, d, generator=g, dtype=F64),
        torch.randn(b, hkv, nk, dv, generator=g, dtype=F64),
    )


def table(fn, b: int, h: int, nq: int, nk: int, dtype=torch.bool) -> torch.Tensor:
    """fn(b, h, q_pos, kv_pos) for every score, by Python loops; q_pos = nk - nq + row."""
    out = torch.empty(b, h, nq, nk, dtype=dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(nq):
                for j in range(nk):
                    out[bi, hi, i, j] = fn(bi, hi, nk - nq + i, j)
    return out


def plain_attention(q, k, v, *, scale=None, keep=None, bias=None, sink=None, softcap=None):
    """(out, lse) in float64: per query head h, kv head h // (Hq / Hkv). The order is
    scores * scale, + bias, softcap, mask, softmax (with sink), fully masked rows -> 0."""
    b, hq, nq, d = q.shape
    group = hq // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, hq, nq, v.shape[-1], dtype=F64)
    lse = torch.zeros(b, hq, nq, dtype=F64)
    for h in range(hq):
        s = torch.einsum("bid,bjd->bij", q[:, h], k[:, h // group]) * scale
        if bias is not None:
            s = s + bias.expand(b, hq, nq, k.shape[2])[:, h]
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        if keep is not None:
            s = s.masked_fill(~keep.expand(b, hq, nq, k.shape[2])[:, h], NEG_INF)
        if sink is not None:
            s = torch.cat([s, sink[h].expand(b, nq, 1)], dim=-1)
        p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
        lse[:, h] = torch.logsumexp(s, dim=-1)
        if sink is not None:
            p = p[..., :-1]
        out[:, h] = p @ v[:, h // group]
    return out, lse


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def default_inv_freq(theta: float, r: int) -> torch.Tensor:
    return torch.tensor([theta ** (-2 * i / r) for i in range(r // 2)], dtype=F64)


def rope_half(x, positions, inv_freq):
    """HF's form: x * cos + rotate_half(x) * sin on the first 2 * len(inv_freq) channels."""
    r = 2 * inv_freq.shape[0]
    freqs = positions.to(F64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    xr, rest = x[..., :r], x[..., r:]
    x1, x2 = xr.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * emb.cos() + rotated * emb.sin(), rest], dim=-1)


def rope_interleaved(x, positions, inv_freq):
    """Meta's original form: channel pairs (2i, 2i+1) as complex numbers times e^(i angle)."""
    r = 2 * inv_freq.shape[0]
    xr, rest = x[..., :r], x[..., r:]
    xc = torch.view_as_complex(xr.reshape(*xr.shape[:-1], r // 2, 2).contiguous())
    angle = positions.to(F64)[:, None] * inv_freq[None, :]
    rotated = torch.view_as_real(xc * torch.polar(torch.ones_like(angle), angle)).flatten(-2)
    return torch.cat([rotated, rest], dim=-1)


# --------------------------------------------------------------------------- matmuls, softmax


def test_plain_causal_matches_sdpa():
    q, k, v = qkv()
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # top-left = ours when Nq == Nk
    close(run_reference(CAUSAL_IR, q, k, v), expected)


def test_unmasked_cross_lengths_match_sdpa_and_dv_differs():
    q, k, v = qkv(nq=5, nk=23, dv=8)
    ir = variant("  %m = attn.qk %q, %k : {QT}, {KT} -> {S}" + TAIL, dv=8)
    out = run_reference(ir, q, k, v)
    assert out.shape == (2, 2, 5, 8)
    close(out, F.scaled_dot_product_attention(q, k, v))


def test_decode_causal_aligns_queries_to_the_end():
    # Nq = 1: the query is the last token, so causal masks nothing.
    q, k, v = qkv(nq=1, nk=20)
    close(run_reference(CAUSAL_IR, q, k, v), F.scaled_dot_product_attention(q, k, v))
    # Nq = 6 < Nk: bottom-right aligned causal mask.
    q, k, v = qkv(nq=6, nk=20, seed=1)
    bottom_right = torch.ones(6, 20, dtype=torch.bool).tril(diagonal=20 - 6)
    close(run_reference(CAUSAL_IR, q, k, v), F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right))


def test_gqa_matches_sdpa():
    q, k, v = qkv(hq=8, hkv=2)
    ir = variant("  %s = attn.qk %q, %k : {QT}, {KT} -> {S}\n  %m = attn.mask %s causal : {S}" + TAIL, hq=8, hkv=2)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    close(run_reference(ir, q, k, v), expected)
    close(
        run_reference(ir, q, k, v),
        plain_attention(q, k, v, keep=table(lambda b, h, i, j: j <= i, 1, 1, 16, 16))[0],
    )


def test_qk_explicit_scale_and_lse():
    q, k, v = qkv(nq=7, nk=11)
    ir = variant("  %m = attn.qk %q, %k scale = 0.3 : {QT}, {KT} -> {S}" + TAIL)
    out, lse = run_reference_with_lse(ir, q, k, v)
    expected, _ = plain_attention(q, k, v, scale=0.3)
    close(out, expected)
    close(lse, torch.logsumexp(q @ k.transpose(-1, -2) * 0.3, dim=-1))


def test_input_forms_and_compute_dtype():
    q, k, v = qkv()
    module = parse_module(CAUSAL_IR)
    from_text = run_reference(CAUSAL_IR, q, k, v)
    close(run_reference(module, q, k, v), from_text)
    close(run_reference(get_func(module), q, k, v), from_text)
    out32 = run_reference(CAUSAL_IR, q.float(), k.float(), v.float(), compute_dtype=torch.float32)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), from_text, rtol=1e-5, atol=1e-5)


def test_executor_is_differentiable():
    q, k, v = (t.requires_grad_() for t in qkv(nq=8, nk=8))
    run_reference(CAUSAL_IR, q, k, v).sum().backward()
    grads = [t.grad for t in (q, k, v)]
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(q2, k2, v2, is_causal=True).sum().backward()
    for got, want in zip(grads, (q2.grad, k2.grad, v2.grad), strict=True):
        close(got, want)


# --------------------------------------------------------------------------- pre-matmul ops


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rope_styles_and_partial_rotary(style, rotary_dim):
    q, k, v = qkv(nq=16, nk=16)
    ir = variant(
        f"""  %qr = attn.rope %q {style} theta = 100.0 rotary_dim = {rotary_dim} : {{QT}}
  %kr = attn.rope %k {style} theta = 100.0 rotary_dim = {rotary_dim} : {{KT}}
  %m = attn.qk %qr, %kr : {{QT}}, {{KT}} -> {{S}}"""
        + TAIL
    )
    rope = rope_half if style == "half" else rope_interleaved
    inv = default_inv_freq(100.0, rotary_dim)
    pos = torch.arange(16)
    expected, _ = plain_attention(rope(q, pos, inv), rope(k, pos, inv), v)
    close(run_reference(ir, q, k, v), expected)
    if rotary_dim < 16:  # channels past rotary_dim must pass through untouched
        assert not torch.allclose(rope(q, pos, inv)[..., :rotary_dim], q[..., :rotary_dim])


def test_rope_styles_differ():
    q, k, v = qkv()
    outs = [
        run_reference(
            variant(
                f"""  %qr = attn.rope %q {style} theta = 10.0 rotary_dim = 16 : {{QT}}
  %kr = attn.rope %k {style} theta = 10.0 rotary_dim = 16 : {{KT}}
  %m = attn.qk %qr, %kr : {{QT}}, {{KT}} -> {{S}}"""
                + TAIL
            ),
            q,
            k,
            v,
        )
        for style in ("half", "interleaved")
    ]
    assert (outs[0] - outs[1]).abs().max() > 1e-3


def test_rope_decode_uses_last_positions():
    # q holds the last 3 of 12 positions: rotated by positions 9, 10, 11.
    q, k, v = qkv(nq=3, nk=12)
    ir = variant(
        """  %qr = attn.rope %q half theta = 50.0 rotary_dim = 16 : {QT}
  %kr = attn.rope %k half theta = 50.0 rotary_dim = 16 : {KT}
  %m = attn.qk %qr, %kr : {QT}, {KT} -> {S}"""
        + TAIL
    )
    inv = default_inv_freq(50.0, 16)
    expected, _ = plain_attention(rope_half(q, torch.arange(9, 12), inv), rope_half(k, torch.arange(12), inv), v)
    close(run_reference(ir, q, k, v), expected)


def test_rope_explicit_inv_freq_only_on_q():
    q, k, v = qkv()
    inv = torch.tensor([0.9, 0.31, 0.05, 0.002], dtype=F64)
    ir = variant(
        """  %qr = attn.rope %q interleaved theta = 10000.0 rotary_dim = 8 inv_freq(%f : tensor<4xf32>) : {QT}
  %m = attn.qk %qr, %k : {QT}, {KT} -> {S}"""
        + TAIL,
        extras=", %f: tensor<4xf32>",
    )
    expected, _ = plain_attention(rope_interleaved(q, torch.arange(16), inv), k, v)
    close(run_reference(ir, q, k, v, inv.float()), expected, tol=1e-6)  # inv_freq given in f32


def test_rope_linear_scaling_divides_frequencies():
    q, k, v = qkv()
    scaling = "#attn.rope_scaling<linear, factor = 4.0>"
    ir = variant(
        f"""  %qr = attn.rope %q half theta = 1000.0 rotary_dim = 16 scaling = {scaling} : {{QT}}
  %kr = attn.rope %k half theta = 1000.0 rotary_dim = 16 scaling = {scaling} : {{KT}}
  %m = attn.qk %qr, %kr : {{QT}}, {{KT}} -> {{S}}"""
        + TAIL
    )
    inv = default_inv_freq(1000.0, 16) / 4.0
    pos = torch.arange(16)
    close(run_reference(ir, q, k, v), plain_attention(rope_half(q, pos, inv), rope_half(k, pos, inv), v)[0])


def test_rope_llama3_scaling():
    # Meta's published llama3 `apply_scaling`, one frequency at a time.
    def llama3(freqs, factor=8.0, low=1.0, high=4.0, old=64.0):
        out = []
        for f in freqs.tolist():
            wavelen = 2 * math.pi / f
            if wavelen < old / high:
                out.append(f)
            elif wavelen > old / low:
                out.append(f / factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return torch.tensor(out, dtype=F64)

    q, k, v = qkv()
    scaling = (
        "#attn.rope_scaling<llama3, factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, "
        "original_max_position = 64.0>"
    )
    ir = variant(
        f"""  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 16 scaling = {scaling} : {{QT}}
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 16 scaling = {scaling} : {{KT}}
  %m = attn.qk %qr, %kr : {{QT}}, {{KT}} -> {{S}}"""
        + TAIL
    )
    inv = llama3(default_inv_freq(10000.0, 16))
    pos = torch.arange(16)
    close(run_reference(ir, q, k, v), plain_attention(rope_half(q, pos, inv), rope_half(k, pos, inv), v)[0])


def test_rope_yarn_attention_factor_scales_cos_and_sin():
    # With rotary_dim 16, theta 10000, original 2048, every frequency is in the ramp or
    # beyond it; attention_factor 1.5 multiplies q and k after rotation.
    q, k, v = qkv()
    scaling = "#attn.rope_scaling<yarn, factor = 4.0, original_max_position = 2048.0, attention_factor = 1.5>"
    ir = variant(
        f"""  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 16 scaling = {scaling} : {{QT}}
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 16 scaling = {scaling} : {{KT}}
  %m = attn.qk %qr, %kr : {{QT}}, {{KT}} -> {{S}}"""
        + TAIL
    )

    def dim_of(rotations):  # YaRN's correction dimension
        return 16 * math.log(2048.0 / (rotations * 2 * math.pi)) / (2 * math.log(10000.0))

    lo, hi = max(math.floor(dim_of(32.0)), 0), min(math.ceil(dim_of(1.0)), 15)
    base = default_inv_freq(10000.0, 16)
    inv = []
    for i in range(8):
        extrapolate = 1 - min(max((i - lo) / (hi - lo), 0.0), 1.0)
        inv.append(base[i] / 4.0 * (1 - extrapolate) + base[i] * extrapolate)
    inv = torch.tensor(inv, dtype=F64)
    pos = torch.arange(16)
    expected, _ = plain_attention(1.5 * rope_half(q, pos, inv), 1.5 * rope_half(k, pos, inv), v)
    close(run_reference(ir, q, k, v), expected)


@pytest.mark.parametrize("with_weight", [False, True])
def test_qk_norm(with_weight):
    q, k, v = qkv()
    q, k = q * 3.0, k * 0.2  # far from unit RMS, so a missing norm shows
    weight = torch.linspace(0.5, 1.5, 16, dtype=F64)
    w = " weight(%w : tensor<16xf32>)" if with_weight else ""
    ir = variant(
        f"""  %qn = attn.norm %q eps = 0.01{w} : {{QT}}
  %kn = attn.norm %k eps = 0.01{w} : {{KT}}
  %m = attn.qk %qn, %kn : {{QT}}, {{KT}} -> {{S}}"""
        + TAIL,
        extras=", %w: tensor<16xf32>" if with_weight else "",
    )

    def rms_norm(x):
        y = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + 0.01)
        return y * weight if with_weight else y

    args = (q, k, v, weight) if with_weight else (q, k, v)
    close(run_reference(ir, *args), plain_attention(rms_norm(q), rms_norm(k), v)[0])


def test_scale_on_tensors_and_scores():
    q, k, v = qkv()
    ir = variant(
        """  %qs = attn.scale %q value = 0.5 : {QT}
  %s = attn.qk %qs, %k : {QT}, {KT} -> {S}
  %m = attn.scale %s value = -3.0 : {S}"""
        + TAIL
    )
    close(run_reference(ir, q, k, v), plain_attention(q, k, v, scale=0.5 * -3.0 / 4.0)[0])


# --------------------------------------------------------------------------- masks


def masked_ir(mask_line: str, extras: str = "", **kw) -> str:
    return variant("  %s = attn.qk %q, %k : {QT}, {KT} -> {S}\n" + mask_line + TAIL, extras=extras, **kw)


@pytest.mark.parametrize(
    ("mask", "keep"),
    [
        ("sliding_window(4)", lambda b, h, i, j: 0 <= i - j < 4),
        ("sliding_window(1)", lambda b, h, i, j: i == j),
        ("prefix_lm(5)", lambda b, h, i, j: j < 5 or j <= i),
        ("prefix_lm(0)", lambda b, h, i, j: j <= i),
    ],
)
@pytest.mark.parametrize("nq", [16, 4])
def test_named_masks(mask, keep, nq):
    q, k, v = qkv(nq=nq, nk=16)
    ir = masked_ir(f"  %m = attn.mask %s {mask} : {{S}}")
    close(run_reference(ir, q, k, v), plain_attention(q, k, v, keep=table(keep, 1, 1, nq, 16))[0])


def test_document_mask_indexes_ids_by_position():
    q, k, v = qkv(nq=6, nk=14)
    ids = torch.tensor([[0] * 5 + [1] * 6 + [2] * 3, [7] * 10 + [3] * 4], dtype=torch.int32)
    ir = masked_ir(
        "  %d = attn.mask %s document(%ids : tensor<?x?xi32>) : {S}\n  %m = attn.mask %d causal : {S}",
        extras=", %ids: tensor<?x?xi32>",
    )
    keep = table(lambda b, h, i, j: bool(ids[b, i] == ids[b, j]) and j <= i, 2, 1, 6, 14)
    close(run_reference(ir, q, k, v, ids), plain_attention(q, k, v, keep=keep)[0])


def test_custom_mask_with_remainder_logic_and_extract():
    # keep where (q - kv) rem 3 != -1 ... written with C remainder (sign of the
    # dividend), kv <= q + 2, and the per-batch allow-list allowed[b, kv] != 0.
    q, k, v = qkv(nq=10, nk=16)
    allowed = torch.tensor([[1] * 12 + [0] * 4, [0, 1] * 8], dtype=torch.int32)
    ir = masked_ir(
        """  %m = attn.mask %s custom(%allowed : tensor<2x?xi32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %a: tensor<2x?xi32>):
    %c3 = arith.constant 3 : i32
    %c2 = arith.constant 2 : i32
    %cm1 = arith.constant -1 : i32
    %c0 = arith.constant 0 : i32
    %diff = arith.subi %qi, %ki : i32
    %r = arith.remsi %diff, %c3 : i32
    %ok1 = arith.cmpi ne, %r, %cm1 : i32
    %lim = arith.addi %qi, %c2 : i32
    %ok2 = arith.cmpi sle, %ki, %lim : i32
    %flag = attn.extract %a[%b, %ki] : tensor<2x?xi32>
    %ok3 = arith.cmpi ne, %flag, %c0 : i32
    %both = arith.andi %ok1, %ok2 : i1
    %all = arith.andi %both, %ok3 : i1
    attn.yield %all : i1
  } : {S}""",
        extras=", %allowed: tensor<2x?xi32>",
    )

    def keep(b, h, i, j):
        return math.fmod(i - j, 3) != -1 and j <= i + 2 and bool(allowed[b, j] != 0)

    assert table(keep, 2, 1, 10, 16).any(-1).all()  # no row empty: the remainder rule matters
    close(run_reference(ir, q, k, v, allowed), plain_attention(q, k, v, keep=table(keep, 2, 1, 10, 16))[0])


def test_multiple_masks_must_all_hold_and_survive_softcap():
    # A masked score stays masked: softcap after the mask must not turn -inf into -cap.
    q, k, v = qkv()
    ir = masked_ir(
        """  %c = attn.mask %s causal : {S}
  %w = attn.mask %c custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %c2 = arith.constant 2 : i32
    %r = arith.remsi %ki, %c2 : i32
    %z = arith.constant 0 : i32
    %even = arith.cmpi eq, %r, %z : i32
    attn.yield %even : i1
  } : {S}
  %m = attn.softcap %w cap = 2.0 : {S}"""
    )
    keep = table(lambda b, h, i, j: j <= i and j % 2 == 0, 1, 1, 16, 16)
    close(run_reference(ir, q, k, v), plain_attention(q, k, v, keep=keep, softcap=2.0)[0])


def test_fully_masked_rows_give_zeros_and_lse_neg_inf():
    # q positions 10..15 of Nk = 16; rows with q_pos < 13 keep nothing.
    q, k, v = qkv(nq=6, nk=16)
    ir = masked_ir(
        """  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.constant 13 : i32
    %ok = arith.cmpi sge, %qi, %c : i32
    attn.yield %ok : i1
  } : {S}"""
    )
    out, lse = run_reference_with_lse(ir, q, k, v)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[:, :, :3] == 0).all() and torch.isneginf(lse[:, :, :3]).all()
    expected, expected_lse = plain_attention(q, k, v, keep=table(lambda b, h, i, j: i >= 13, 1, 1, 6, 16))
    close(out, expected)
    close(lse, expected_lse)


# --------------------------------------------------------------------------- biases, softcap, score_mod


def test_alibi_bias():
    q, k, v = qkv(hq=4, hkv=2, nq=5, nk=12)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=F64)
    ir = variant(
        """  %s = attn.qk %q, %k : {QT}, {KT} -> {S}
  %a = attn.bias %s alibi(%slopes : tensor<4xf32>) : {S}
  %m = attn.mask %a causal : {S}"""
        + TAIL,
        hq=4,
        extras=", %slopes: tensor<4xf32>",
    )
    bias = table(lambda b, h, i, j: slopes[h] * (j - i), 1, 4, 5, 12, dtype=F64)
    keep = table(lambda b, h, i, j: j <= i, 1, 1, 5, 12)
    close(run_reference(ir, q, k, v, slopes), plain_attention(q, k, v, bias=bias, keep=keep)[0])


def test_custom_bias_relative_table_with_extract():
    # bias = table[h, q - kv + 15]: a learned relative-position bias (T5 style).
    q, k, v = qkv(nq=16, nk=16)
    rel = torch.randn(2, 31, dtype=F64, generator=torch.Generator().manual_seed(3))
    ir = masked_ir(
        """  %m = attn.bias %s custom(%t : tensor<2x31xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %tab: tensor<2x31xf32>):
    %off = arith.constant 15 : i32
    %d = arith.subi %qi, %ki : i32
    %i = arith.addi %d, %off : i32
    %x = attn.extract %tab[%h, %i] : tensor<2x31xf32>
    attn.yield %x : f32
  } : {S}""",
        extras=", %t: tensor<2x31xf32>",
    )
    bias = table(lambda b, h, i, j: rel[h, i - j + 15], 1, 2, 16, 16, dtype=F64)
    close(run_reference(ir, q, k, v, rel), plain_attention(q, k, v, bias=bias)[0])


def test_custom_bias_integer_rounding_semantics():
    # (Float constants are powers of two: an f32 constant holds its f32-rounded value.)
    # divsi truncates, floordivsi rounds down, remsi takes the dividend's sign, absi.
    q, k, v = qkv(nq=9, nk=13)
    ir = masked_ir(
        """  %m = attn.bias %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %c3 = arith.constant 3 : i32
    %d = arith.subi %ki, %qi : i32
    %t = arith.divsi %d, %c3 : i32
    %f = arith.floordivsi %d, %c3 : i32
    %r = arith.remsi %d, %c3 : i32
    %a = math.absi %d : i32
    %tf = arith.sitofp %t : i32 to f32
    %ff = arith.sitofp %f : i32 to f32
    %rf = arith.sitofp %r : i32 to f32
    %af = arith.sitofp %a : i32 to f32
    %c01 = arith.constant 0.015625 : f32
    %c1 = arith.constant 0.125 : f32
    %c10 = arith.constant 10.0 : f32
    %x1 = arith.mulf %ff, %c10 : f32
    %x2 = arith.addf %tf, %x1 : f32
    %x3 = arith.mulf %rf, %c1 : f32
    %x4 = arith.addf %x2, %x3 : f32
    %x5 = arith.mulf %af, %c01 : f32
    %x6 = arith.addf %x4, %x5 : f32
    %x7 = arith.mulf %x6, %c1 : f32
    attn.yield %x7 : f32
  } : {S}"""
    )

    def bias(b, h, i, j):
        d = j - i
        return 0.125 * (int(d / 3) + 10 * math.floor(d / 3) + 0.125 * math.fmod(d, 3) + 0.015625 * abs(d))

    close(run_reference(ir, q, k, v), plain_attention(q, k, v, bias=table(bias, 1, 1, 9, 13, dtype=F64))[0])


def test_custom_bias_i32_wraparound_and_i1_extensions():
    # kv * 2^30 wraps in i32; extsi of an i1 true is -1, extui is 1.
    q, k, v = qkv(nq=8, nk=8)
    ir = masked_ir(
        """  %m = attn.bias %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %big = arith.constant 1073741824 : i32
    %z = arith.constant 0 : i32
    %prod = arith.muli %ki, %big : i32
    %neg = arith.cmpi slt, %prod, %z : i32
    %le = arith.cmpi sle, %ki, %qi : i32
    %sx = arith.extsi %neg : i1 to i32
    %u = arith.extui %le : i1 to i32
    %s2 = arith.addi %sx, %sx : i32
    %sum = arith.addi %s2, %u : i32
    %f = arith.sitofp %sum : i32 to f32
    attn.yield %f : f32
  } : {S}"""
    )

    def wrap32(x):
        return (x + 2**31) % 2**32 - 2**31

    def bias(b, h, i, j):
        return -2.0 * (wrap32(j * 2**30) < 0) + (j <= i)

    close(run_reference(ir, q, k, v), plain_attention(q, k, v, bias=table(bias, 1, 1, 8, 8, dtype=F64))[0])


def test_softcap():
    q, k, v = qkv()
    q = q * 4  # large scores, so the cap bites
    ir = masked_ir("  %m = attn.softcap %s cap = 5.0 : {S}")
    close(run_reference(ir, q, k, v), plain_attention(q, k, v, softcap=5.0)[0])


def test_score_mod_reads_score_head_and_weights():
    # s := tanh(s / 4) * 4 * w[h] + 0.25 * h - (q - kv)^2 / 64
    q, k, v = qkv(hq=4, hkv=1)
    w = torch.tensor([1.0, 0.5, 2.0, -1.0], dtype=F64)
    ir = variant(
        """  %s = attn.qk %q, %k : {QT}, {KT} -> {S}
  %m = attn.score_mod %s (%w : tensor<4xf32>) {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32, %wt: tensor<4xf32>):
    %c4 = arith.constant 4.0 : f32
    %cq = arith.constant 0.25 : f32
    %cs = arith.constant 0.015625 : f32
    %y = arith.divf %x, %c4 : f32
    %t = math.tanh %y : f32
    %t4 = arith.mulf %t, %c4 : f32
    %wh = attn.extract %wt[%h] : tensor<4xf32>
    %tw = arith.mulf %t4, %wh : f32
    %hf = arith.sitofp %h : i32 to f32
    %hb = arith.mulf %hf, %cq : f32
    %d = arith.subi %qi, %ki : i32
    %d2 = arith.muli %d, %d : i32
    %df = arith.sitofp %d2 : i32 to f32
    %dp = arith.mulf %df, %cs : f32
    %u = arith.addf %tw, %hb : f32
    %r = arith.subf %u, %dp : f32
    attn.yield %r : f32
  } : {S}"""
        + TAIL,
        hq=4,
        hkv=1,
        extras=", %w: tensor<4xf32>",
    )
    scores = q @ k.transpose(-1, -2) / 4.0
    pos_q = torch.arange(16).view(16, 1)
    modded = torch.tanh(scores / 4) * 4 * w.view(1, 4, 1, 1) + 0.25 * torch.arange(4).view(1, 4, 1, 1)
    modded = modded - 0.015625 * (pos_q - torch.arange(16).view(1, 16)).to(F64) ** 2
    expected = torch.softmax(modded, dim=-1) @ v
    close(run_reference(ir, q, k, v, w), expected)


CMPF = [
    "false",
    "oeq",
    "ogt",
    "oge",
    "olt",
    "ole",
    "one",
    "ord",
    "ueq",
    "ugt",
    "uge",
    "ult",
    "ule",
    "une",
    "uno",
    "true",
]


@pytest.mark.parametrize("pred", CMPF)
@pytest.mark.parametrize("against_nan", [False, True])
def test_score_mod_cmpf_predicates(pred, against_nan):
    # s := cmpf(pred, s, c) ? s : s / 2, with c = 0.0 or NaN (made as 0 / 0). (Not s - 1:
    # softmax is blind to a shift of a whole row, so a constant predicate would not show.)
    q, k, v = qkv(nq=6, nk=6)
    c = "%nan" if against_nan else "%zero"
    ir = variant(
        f"""  %s = attn.qk %q, %k : {{QT}}, {{KT}} -> {{S}}
  %m = attn.score_mod %s {{
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %zero = arith.constant 0.0 : f32
    %half = arith.constant 0.5 : f32
    %nan = arith.divf %zero, %zero : f32
    %c = arith.cmpf {pred}, %x, {c} : f32
    %y = arith.mulf %x, %half : f32
    %r = arith.select %c, %x, %y : f32
    attn.yield %r : f32
  }} : {{S}}"""
        + TAIL
    )
    s = q @ k.transpose(-1, -2) / 4.0
    if against_nan:  # ordered predicates are false, unordered ones true
        cond = torch.full_like(s, pred == "true" or pred.startswith("u"), dtype=torch.bool)
    else:
        cmp = {"eq": s == 0, "gt": s > 0, "ge": s >= 0, "lt": s < 0, "le": s <= 0, "ne": s != 0}
        cond = {"false": s != s, "true": s == s, "ord": s == s, "uno": s != s}.get(pred)
        if cond is None:
            cond = cmp[pred[1:]]
    expected = torch.softmax(torch.where(cond, s, s / 2), dim=-1) @ v
    close(run_reference(ir, q, k, v), expected)


CMPI = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]


@pytest.mark.parametrize("pred", CMPI)
@pytest.mark.parametrize("width", [32, 64])
def test_mask_cmpi_predicates_signed_and_unsigned(pred, width):
    # keep where cmpi(pred, kv - q, -3) in i32 or i64; unsigned predicates see -3 as 2^width - 3.
    q, k, v = qkv(nq=8, nk=8)
    widen = "    %dw = arith.extsi %d : i32 to i64\n" if width == 64 else ""
    ir = masked_ir(
        f"""  %m = attn.mask %s custom {{
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.constant -3 : i{width}
    %d = arith.subi %ki, %qi : i32
{widen}    %ok = arith.cmpi {pred}, {"%dw" if widen else "%d"}, %c : i{width}
    attn.yield %ok : i1
  }} : {{S}}"""
    )

    def keep(b, h, i, j):
        x, y = j - i, -3
        if pred.startswith("u"):
            x, y = x % 2**width, y % 2**width
        op = pred[-2:] if pred not in ("eq", "ne") else pred
        return {"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y}[op]

    close(run_reference(ir, q, k, v), plain_attention(q, k, v, keep=table(keep, 1, 1, 8, 8))[0])


# --------------------------------------------------------------------------- sinks


def test_sink_adds_to_the_normaliser():
    q, k, v = qkv(hq=4, hkv=2, nq=5, nk=9)
    sink = torch.tensor([0.0, 2.0, -1.0, 5.0], dtype=F64)
    ir = variant(
        """  %s = attn.qk %q, %k : {QT}, {KT} -> {S}
  %m = attn.mask %s causal : {S}
  %p = attn.softmax %m sink(%sink : tensor<4xf32>) : {S} -> {P}
  %o = attn.pv %p, %v : {P}, {VT} -> {OT}""",
        hq=4,
        extras=", %sink: tensor<4xf32>",
    )
    out, lse = run_reference_with_lse(ir, q, k, v, sink)
    expected, expected_lse = plain_attention(q, k, v, keep=table(lambda b, h, i, j: j <= i, 1, 1, 5, 9), sink=sink)
    close(out, expected)
    close(lse, expected_lse)


def test_sink_with_fully_masked_rows():
    # Every score masked: p = 0, out = 0, and the lse is the sink logit alone (750:
    # exp(750) overflows float64, so this also checks the max-subtraction).
    q, k, v = qkv(nq=4, nk=6)
    sink = torch.tensor([750.0, -0.5], dtype=F64)
    ir = variant(
        """  %s = attn.qk %q, %k : {QT}, {KT} -> {S}
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.constant 100 : i32
    %lim = arith.addi %qi, %c : i32
    %ok = arith.cmpi sgt, %ki, %lim : i32
    attn.yield %ok : i1
  } : {S}
  %p = attn.softmax %m sink(%sink : tensor<2xf32>) : {S} -> {P}
  %o = attn.pv %p, %v : {P}, {VT} -> {OT}""",
        extras=", %sink: tensor<2xf32>",
    )
    out, lse = run_reference_with_lse(ir, q, k, v, sink)
    assert (out == 0).all()
    close(lse, sink.view(1, 2, 1).expand(2, 2, 4))


# --------------------------------------------------------------------------- composed variants


def test_qwen3_like_norm_rope_causal_gqa():
    q, k, v = qkv(hq=4, hkv=2, nq=12, nk=12)
    wq = torch.linspace(0.8, 1.2, 16, dtype=F64)
    wk = torch.linspace(1.3, 0.7, 16, dtype=F64)
    ir = variant(
        """  %qn = attn.norm %q eps = 1.0e-06 weight(%wq : tensor<16xf32>) : {QT}
  %kn = attn.norm %k eps = 1.0e-06 weight(%wk : tensor<16xf32>) : {KT}
  %qr = attn.rope %qn half theta = 1000000.0 rotary_dim = 16 : {QT}
  %kr = attn.rope %kn half theta = 1000000.0 rotary_dim = 16 : {KT}
  %s = attn.qk %qr, %kr : {QT}, {KT} -> {S}
  %m = attn.mask %s causal : {S}"""
        + TAIL,
        hq=4,
        extras=", %wq: tensor<16xf32>, %wk: tensor<16xf32>",
    )

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    inv, pos = default_inv_freq(1e6, 16), torch.arange(12)
    qe, ke = rope_half(rms(q, wq), pos, inv), rope_half(rms(k, wk), pos, inv)
    expected = F.scaled_dot_product_attention(qe, ke, v, is_causal=True, enable_gqa=True)
    close(run_reference(ir, q, k, v, wq, wk), expected)


def test_gemma2_like_scale_softcap_window():
    q, k, v = qkv(nq=16, nk=16)
    q, k = q * 3, k * 3
    ir = variant(
        """  %qs = attn.scale %q value = 0.0625 : {QT}
  %s = attn.qk %qs, %k scale = 1.0 : {QT}, {KT} -> {S}
  %c = attn.softcap %s cap = 5.0 : {S}
  %w = attn.mask %c sliding_window(6) : {S}
  %m = attn.mask %w causal : {S}"""
        + TAIL
    )
    keep = table(lambda b, h, i, j: 0 <= i - j < 6, 1, 1, 16, 16)
    close(run_reference(ir, q, k, v), plain_attention(q, k, v, scale=0.0625, softcap=5.0, keep=keep)[0])


# --------------------------------------------------------------------------- errors


def test_wrong_argument_count():
    q, k, v = qkv()
    with pytest.raises(AttnFuseError, match=r"@f takes 3 arguments \(%q, %k, %v\), got 2"):
        run_reference(CAUSAL_IR, q, k)


def test_wrong_rank_static_dim_and_dtype_kind():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"argument 1 \(%k\) must have rank 4"):
        run_reference(CAUSAL_IR, q, k[0], v)
    with pytest.raises(ValueError, match=r"argument 0 \(%q\) must have size 2 in dim 1"):
        run_reference(CAUSAL_IR, torch.randn(2, 3, 16, 16), k, v)
    with pytest.raises(ValueError, match=r"argument 2 \(%v\) must be a floating-point tensor"):
        run_reference(CAUSAL_IR, q, k, v.long())
    with pytest.raises(ValueError, match=r"argument 2 \(%v\) must be a torch.Tensor"):
        run_reference(CAUSAL_IR, q, k, [1.0])
    with pytest.raises(ValueError, match="k has batch 3"):
        run_reference(CAUSAL_IR, q, torch.randn(3, 2, 16, 16), v)


def test_bad_runtime_data_in_masks():
    q, k, v = qkv(nq=4, nk=8)
    ir = masked_ir("  %m = attn.mask %s document(%ids : tensor<?x?xi32>) : {S}", extras=", %ids: tensor<?x?xi32>")
    with pytest.raises(ValueError, match=r"document ids must have shape \[B, Nk\] = \[2, 8\]"):
        run_reference(ir, q, k, v, torch.zeros(2, 4, dtype=torch.int32))
    # (Out-of-bounds extracts and integer division by zero are defined, not errors:
    # python_tests/test_bounds.py.)


def test_unsupported_region_op_is_named():
    q, k, v = qkv()
    ir = masked_ir(
        """  %m = attn.score_mod %s {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %y = math.erf %x : f32
    attn.yield %y : f32
  } : {S}"""
    )
    with pytest.raises(ValueError, match=r"attn.score_mod region may not hold 'math.erf'"):
        run_reference(ir, q, k, v)


def test_invalid_ir_is_a_value_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="attn.softcap cap must be > 0"):
        run_reference(masked_ir("  %m = attn.softcap %s cap = 0.0 : {S}"), q, k, v)
    with pytest.raises(ValueError, match="invalid attn IR"):
        run_reference("func.func @f( {", q, k, v)
    with pytest.raises(ValueError, match="exactly one func.func, found 2"):
        run_reference(CAUSAL_IR + CAUSAL_IR.replace("@f", "@g"), q, k, v)
