"""The sm90 Gluon kernel path (kernel-path `gluon-sm90`) on a Hopper GPU, against the
reference executor in float64 on the CPU (same inputs), in bf16 and fp16.

For each variant family (plain causal, no mask, RoPE + causal with GQA, Qwen3's QK-norm + RoPE
(both applied to Q inside the Gluon kernel, head dims 128 and 64), an interleaved RoPE (Q rotated by rotate_q first),
an RMSNorm alone,
head dims 64 (on request: gluon_head_dims), 128 and 256; through the generated score functions:
Gemma 2's RoPE + softcap + window, windows, prefix-LM, softcap without a mask, ALiBi, sinks with
and without a window, packed documents, a score_mod and a custom mask with an extra tensor whose
first row keeps no key), the generated module (min-len 2048 for every variant:
gluon_min_len_transformed) runs it at N = 2048 and the test checks both that the Gluon kernel
ran (a counting wrapper around the module's `_gluon_attention`) and the output and
log-sum-exp. Calls it does not cover go to the generic kernel of the same module: a length
that is not a multiple of 128 (every family at N = 1000), Nq != Nk, a misaligned view;
non-contiguous q / v (the Hugging Face layout) take the Gluon kernel after a copy. Through the
runtime at N = 4096: Llama 3, a Gemma 2 local layer (window 1024) and packed documents with sinks,
and their gradients (the backward consumes the Gluon forward's out and lse).

Marked `gpu`; skipped without CUDA and on GPUs other than sm 90.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from kernel_harness import CUSTOM_MASK, SCORE_MOD, variant

import attnfuse as af
from attnfuse import variants
from attnfuse.cache import load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.reference import run_reference_with_lse
from attnfuse.runtime import device_sm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.is_available() and device_sm() != 90, reason="the Gluon kernel is sm 90's"),
]

TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}
ROPE = "attn.rope {x} half theta = 10000.0 rotary_dim = {D}"
ROPE_INTERLEAVED = "attn.rope {x} interleaved theta = 10000.0 rotary_dim = {D}"
NORM = "attn.norm {x} eps = 1.0e-06 weight(%w{W} : tensor<{D}xf32>)"
PLAIN_NORM = "attn.norm {x} eps = 1.0e-06"
CAUSAL = "attn.mask {s} causal"


def _doc_ids(b: int, n: int) -> torch.Tensor:
    """Documents of uneven lengths, cut inside and at the edges of 128-key blocks."""
    ids = torch.zeros(b, n, dtype=torch.int32)
    for row, cuts in enumerate(([100, 128, 700, 1500], [5, 1024, 1025])[:b]):
        for c in cuts:
            ids[row, c:] += 1
    return ids


# name -> (b, hq, hkv, d, dtype, pieces of kernel_harness.variant, extra tensors for N)
CASES = {
    "causal-d128-bf16": (1, 8, 2, 128, torch.bfloat16, dict(score_ops=[CAUSAL]), None),
    "full-d64-f16": (1, 4, 4, 64, torch.float16, dict(), None),
    "causal-d64-f16": (1, 4, 2, 64, torch.float16, dict(score_ops=[CAUSAL]), None),
    "rope-causal-d128-bf16": (1, 8, 2, 128, torch.bfloat16, dict(q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL]), None),
    "rope-causal-d128-f16": (1, 8, 2, 128, torch.float16, dict(q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL]), None),
    "rope-causal-d64-f16": (2, 4, 2, 64, torch.float16, dict(q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL]), None),
    "qknorm-rope-d128-bf16": (
        1,
        8,
        2,
        128,
        torch.bfloat16,
        dict(
            q_ops=[NORM, ROPE],
            k_ops=[NORM, ROPE],
            score_ops=[CAUSAL],
            extras=["%wq: tensor<{D}xf32>", "%wk: tensor<{D}xf32>"],
        ),
        lambda g, n: [1 + 0.2 * torch.randn(128, generator=g) for _ in range(2)],
    ),
    "qknorm-rope-d64-f16": (
        2,
        4,
        2,
        64,
        torch.float16,
        dict(q_ops=[PLAIN_NORM, ROPE], k_ops=[PLAIN_NORM, ROPE], score_ops=[CAUSAL]),
        None,
    ),
    # Q transforms the Gluon kernel leaves to rotate_q (an interleaved RoPE); an RMSNorm alone.
    "rope-interleaved-d128-bf16": (
        1,
        8,
        2,
        128,
        torch.bfloat16,
        dict(
            q_ops=[ROPE.replace("half", "interleaved")], k_ops=[ROPE.replace("half", "interleaved")], score_ops=[CAUSAL]
        ),
        None,
    ),
    "qknorm-no-weight-f16": (
        1,
        8,
        2,
        128,
        torch.float16,
        dict(q_ops=[PLAIN_NORM], k_ops=[PLAIN_NORM], score_ops=[CAUSAL]),
        None,
    ),
    # Score ops through the generated score functions (a window not a multiple of 128).
    "gemma2-rope-softcap-window-bf16": (
        1,
        8,
        2,
        128,
        torch.bfloat16,
        dict(
            q_ops=[ROPE],
            k_ops=[ROPE],
            qk="scale = 0.0625",
            score_ops=["attn.softcap {s} cap = 5.0", "attn.mask {s} sliding_window(300)"],
        ),
        None,
    ),
    "window-f16": (1, 8, 8, 128, torch.float16, dict(score_ops=["attn.mask {s} sliding_window(128)"]), None),
    # Head dim 256 (Gemma 2 and 3: 64-key blocks in a 2-deep ring).
    "rope-causal-d256-bf16": (1, 4, 2, 256, torch.bfloat16, dict(q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL]), None),
    "gemma2-softcap-window-d256-bf16": (
        1,
        4,
        2,
        256,
        torch.bfloat16,
        dict(qk="scale = 0.0625", score_ops=["attn.softcap {s} cap = 50.0", "attn.mask {s} sliding_window(300)"]),
        None,
    ),
    "prefix-lm-bf16": (1, 8, 2, 128, torch.bfloat16, dict(score_ops=["attn.mask {s} prefix_lm(700)"]), None),
    "softcap-no-mask-f16": (1, 8, 2, 128, torch.float16, dict(score_ops=["attn.softcap {s} cap = 2.0"]), None),
    "alibi-causal-bf16": (
        1,
        8,
        2,
        128,
        torch.bfloat16,
        dict(score_ops=["attn.bias {s} alibi(%sl : tensor<8xf32>)", CAUSAL], extras=["%sl: tensor<8xf32>"]),
        lambda g, n: [torch.tensor([2.0 ** -(i + 1) for i in range(8)])],
    ),
    "sink-causal-bf16": (
        1,
        8,
        2,
        128,
        torch.bfloat16,
        dict(score_ops=[CAUSAL], softmax="sink(%sk : tensor<8xf32>)", extras=["%sk: tensor<8xf32>"]),
        lambda g, n: [torch.tensor([0.0, 1.5, -2.0, 4.0, 8.0, -8.0, 0.5, 3.0])],
    ),
    "gpt-oss-rope-window-sink-f16": (
        1,
        8,
        2,
        128,
        torch.float16,
        dict(
            q_ops=[ROPE],
            k_ops=[ROPE],
            score_ops=["attn.mask {s} sliding_window(128)"],
            softmax="sink(%sk : tensor<8xbf16>)",
            extras=["%sk: tensor<8xbf16>"],
        ),
        lambda g, n: [torch.randn(8, generator=g).bfloat16() * 3],
    ),
    # Head dim 64 (three consumer warpgroups, 192-row tiles) through the score functions, a sink
    # and two batches: a last tile past N must not write into the next head's rows.
    "document-window-sink-d64-bf16": (
        2,
        8,
        2,
        64,
        torch.bfloat16,
        dict(
            score_ops=[CAUSAL, "attn.mask {s} document(%ids : tensor<?x?xi32>)", "attn.mask {s} sliding_window(300)"],
            softmax="sink(%sk : tensor<8xf32>)",
            extras=["%ids: tensor<?x?xi32>", "%sk: tensor<8xf32>"],
        ),
        lambda g, n: [_doc_ids(2, n), torch.randn(8, generator=g)],
    ),
    "document-causal-bf16": (
        2,
        8,
        2,
        128,
        torch.bfloat16,
        dict(score_ops=[CAUSAL, "attn.mask {s} document(%ids : tensor<?x?xi32>)"], extras=["%ids: tensor<?x?xi32>"]),
        lambda g, n: [_doc_ids(2, n)],
    ),
    "score-mod-causal-f16": (1, 8, 2, 128, torch.float16, dict(score_ops=[SCORE_MOD, CAUSAL]), None),
    "custom-mask-bf16": (
        1,
        8,
        2,
        128,
        torch.bfloat16,
        dict(score_ops=[CUSTOM_MASK], extras=["%t: tensor<?xi32>"]),
        lambda g, n: [(torch.rand(n, generator=g) < 0.3).int()],
    ),
}


def _ir(hq: int, hkv: int, d: int, dtype: torch.dtype, pieces: dict) -> str:
    pieces = {k: [p.replace("{D}", str(d)) for p in v] if isinstance(v, list) else v for k, v in pieces.items()}
    for key in ("q_ops", "k_ops"):
        pieces[key] = [p.replace("{W}", key[0]) for p in pieces.get(key, [])]
    return variant(dtype=dtype, hq=hq, hkv=hkv, d=d, **pieces)


def _inputs(case: tuple, nq: int, nk: int) -> list[torch.Tensor]:
    b, hq, hkv, d, dtype, _, make_extras = case
    g = torch.Generator().manual_seed(nq * 7 + nk)
    xs = [torch.randn(b, h, n, d, generator=g).to(dtype) for h, n in ((hq, nq), (hkv, nk), (hkv, nk))]
    return xs + (make_extras(g, nk) if make_extras else [])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gluon_kernels")


def _module(ir: str, folder: Path, seq_len: int, min_len: int = 2048) -> tuple[ModuleType, list[int]]:
    """The generated module (sm 90, compiled for seq_len; the Gluon kernel from min_len, for every
    variant) and a list counting its Gluon launches."""
    source = compile_module(
        parse_module(ir),
        sm=device_sm(),
        seq_len=seq_len,
        gluon_head_dims=(64, 128, 256),
        gluon_min_len=min_len,
        gluon_min_len_transformed=min_len,
    ).source
    assert "_gluon_attention(" in source, "kernel-path did not choose the Gluon kernel"
    kern = load_source(source, folder, interpret=False)
    calls: list[int] = []
    real = kern._gluon_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    kern._gluon_attention = counting
    return kern, calls


def _check(kern: ModuleType, ir: str, cpu_args: list[torch.Tensor], gpu_args: list[torch.Tensor], what: str) -> None:
    dtype = cpu_args[0].dtype
    out, lse = kern.launch(*gpu_args)
    torch.cuda.synchronize()
    ref, ref_lse = run_reference_with_lse(ir, *cpu_args)
    out = out.double().cpu()
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    err = ((out - ref).abs() - TOL[dtype] * ref.abs()).max().item()
    assert err <= TOL[dtype], f"{what}: max |out - ref| - tol |ref| = {err:.3e}"
    lse = lse.double().cpu()
    empty = ref_lse == float("-inf")  # rows that keep no key (a custom mask's first query)
    assert torch.equal(lse == float("-inf"), empty), f"{what}: lse is -inf on other rows than the reference's"
    lse_err = (lse[~empty] - ref_lse[~empty]).abs().max().item()
    assert lse_err <= TOL[dtype], f"{what}: lse error {lse_err:.3e}"


@pytest.mark.parametrize("name", list(CASES))
def test_gluon_kernel_matches_the_reference(name: str, folder: Path) -> None:
    _, hq, hkv, d, dtype, pieces, _ = CASES[name]
    ir = _ir(hq, hkv, d, dtype, pieces)
    kern, calls = _module(ir, folder, 2048)
    args = _inputs(CASES[name], 2048, 2048)
    _check(kern, ir, args, [a.cuda() for a in args], name)
    assert calls == [1], f"{name}: the Gluon kernel did not run"


D64_CASES = [name for name, case in CASES.items() if case[3] == 64]


@pytest.mark.parametrize("n", [2304, 2176, 2432])
@pytest.mark.parametrize("name", D64_CASES)
def test_head_dim_64_tiles_of_192_rows(name: str, n: int, folder: Path) -> None:
    """Head dim 64 past N = 2048 runs 192-row Q tiles (three consumer warpgroups; up to 2048 two,
    as every family's test at 2048 above): N = 2304 fills the last tile, 2176 and 2432 leave two
    and one of its warpgroups past N, whose rows must be neither written nor read past the
    sequence."""
    _, hq, hkv, d, dtype, pieces, _ = CASES[name]
    ir = _ir(hq, hkv, d, dtype, pieces)
    kern, calls = _module(ir, folder, 4096, min_len=512)
    assert kern._gl_consumers(64, n) == (3, False) and kern._gl_consumers(64, 2048)[0] == 2
    args = _inputs(CASES[name], n, n)
    _check(kern, ir, args, [a.cuda() for a in args], f"{name} at N = {n}")
    assert calls == [1], f"{name}: the Gluon kernel did not run"


D256_CASES = [name for name, case in CASES.items() if case[3] == 256]


@pytest.mark.parametrize("n", [512, 1024])
@pytest.mark.parametrize("name", D256_CASES)
def test_head_dim_256_short_sequences_in_tiles_of_64_rows(name: str, n: int, folder: Path) -> None:
    """Head dim 256 up to N = 1024 runs 64-row Q tiles (one consumer warpgroup; two past it, as
    the tests at 2048 above)."""
    _, hq, hkv, d, dtype, pieces, _ = CASES[name]
    ir = _ir(hq, hkv, d, dtype, pieces)
    kern, calls = _module(ir, folder, n, min_len=512)
    assert kern._gl_consumers(256, n) == (1, False) and kern._gl_consumers(256, 2048)[0] == 2
    args = _inputs(CASES[name], n, n)
    _check(kern, ir, args, [a.cuda() for a in args], f"{name} at N = {n}")
    assert calls == [1], f"{name}: the Gluon kernel did not run"


@pytest.mark.parametrize("nq,nk", [(2000, 2000), (1024, 2048)], ids=["ragged", "nq-lt-nk"])
def test_calls_the_gluon_kernel_does_not_cover_take_the_generic_kernel(nq: int, nk: int, folder: Path) -> None:
    _, hq, hkv, d, dtype, pieces, _ = CASES["rope-causal-d128-bf16"]
    ir = _ir(hq, hkv, d, dtype, pieces)
    kern, calls = _module(ir, folder, 2048)
    args = _inputs(CASES["rope-causal-d128-bf16"], nq, nk)
    _check(kern, ir, args, [a.cuda() for a in args], f"nq={nq} nk={nk}")
    assert calls == [], "the Gluon kernel ran on a call it does not cover"


@pytest.mark.parametrize("name", list(CASES))
def test_every_family_at_a_length_not_a_multiple_of_128(name: str, folder: Path) -> None:
    """N = 1000 (Gluon from N = 512 here, so that only the ragged length turns it away): the
    module's generic kernel computes the call, with the variant's mask, score functions and
    extras, and matches the reference; at N = 1024 the same module would take the Gluon kernel."""
    _, hq, hkv, d, dtype, pieces, _ = CASES[name]
    ir = _ir(hq, hkv, d, dtype, pieces)
    kern, calls = _module(ir, folder, 1024, min_len=512)
    assert "_gluon_fits(q, k, v, 512)" in Path(kern.__file__ or "").read_text()
    args = _inputs(CASES[name], 1000, 1000)
    gpu = [a.cuda() for a in args]
    assert not kern._gluon_fits(*gpu[:3], 512)
    aligned = [torch.empty(*x.shape[:2], 1024, x.shape[3], dtype=x.dtype, device=x.device) for x in gpu[:3]]
    assert kern._gluon_fits(*aligned, 512)
    _check(kern, ir, args, gpu, f"{name} at N = 1000")
    assert calls == [], f"{name}: the Gluon kernel ran at N = 1000"


def test_misaligned_and_non_contiguous_inputs(folder: Path) -> None:
    _, hq, hkv, d, dtype, pieces, _ = CASES["causal-d128-bf16"]
    ir = _ir(hq, hkv, d, dtype, pieces)
    kern, calls = _module(ir, folder, 2048)
    args = _inputs(CASES["causal-d128-bf16"], 2048, 2048)
    # The Hugging Face layout: [B, N, H, D] storage seen as [B, H, N, D].
    hf = [a.transpose(1, 2).contiguous().cuda().transpose(1, 2) for a in args]
    assert not hf[0].is_contiguous()
    _check(kern, ir, args, hf, "non-contiguous q, k, v")
    assert calls == [1]
    # The output in q's layout (as SDPA's), written in place by the kernel (`_gl_inner`).
    assert kern.launch(*hf)[0].transpose(1, 2).is_contiguous() and calls == [1, 1]
    # One element of offset: q's data 2 bytes off a 16-byte boundary (TMA needs 16).
    flat = torch.empty(args[0].numel() + 1, dtype=dtype, device="cuda")
    q = flat[1:].view(args[0].shape).copy_(args[0])
    _check(kern, ir, args, [q, args[1].cuda(), args[2].cuda()], "misaligned q")
    assert calls == [1, 1], "a misaligned q went to the Gluon kernel"


@pytest.mark.parametrize(
    "name,n",
    [
        ("rope-causal-d128-bf16", 1024),
        ("full-d64-f16", 2176),
        ("qknorm-rope-d64-f16", 2176),
        ("rope-causal-d256-bf16", 1024),
    ],
)
def test_the_hugging_face_layout_in_place(name: str, n: int, folder: Path) -> None:
    """q, k, v and the output as transformers lays them out, [B, N, H, D] tensors seen through
    transpose(1, 2), for two sequences: the Gluon kernel reads and writes them in place through
    [B * N, H * D] views (row n of head h: row b * N + n, columns h * D..). At head dim 64 past
    N = 2048 the last 192-row tile's rows past N are the next sequence's rows in that view: read,
    never written (nor their lse)."""
    b, *rest = CASES[name]
    case = (2, *rest)
    _, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    kern, calls = _module(ir, folder, n, min_len=512)
    args = _inputs(case, n, n)
    hf = [a.transpose(1, 2).contiguous().cuda().transpose(1, 2) for a in args[:3]] + [a.cuda() for a in args[3:]]
    assert all(kern._gl_inner(x) for x in hf[:3])
    _check(kern, ir, args, hf, f"{name} in the Hugging Face layout at N = {n}")
    assert calls == [1], f"{name}: the Gluon kernel did not run"
    out = kern.launch(*hf)[0]
    assert out.transpose(1, 2).is_contiguous()


@af.variant
def gemma2_window_1024(q, k, v):
    """Gemma 2's local layer with a window shorter than the sequence (the Gluon kernel's softcap
    by tanh.approx, its window by the generated KV range)."""
    q = af.rope(q, theta=10000.0)
    k = af.rope(k, theta=10000.0)
    s = af.softcap(af.qk(q, k, scale=1.0 / 16.0), 50.0)
    return af.pv(af.softmax(af.mask(s, af.sliding_window(1024))), v)


@af.variant
def packed_with_sinks(q, k, v, doc_ids, sinks):
    """Packed documents (an opaque mask: every block masked) with per-head sinks."""
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal & af.document(doc_ids)), sink=sinks), v)


@pytest.mark.parametrize("name", ["llama3", "gemma2_window_1024", "packed_with_sinks"])
def test_runtime_forward_and_backward(name: str) -> None:
    """The runtime's kernel at N = 4096 launches the Gluon forward; its output, and the
    gradients of the backward that reads its out and lse (the backward recomputes the scores
    with its own, precise softcap), match the reference executor in float32."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(1, h, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        for h in (32, 8, 8)
    )
    fn = {"llama3": variants.llama3, "gemma2_window_1024": gemma2_window_1024, "packed_with_sinks": packed_with_sinks}
    extras = []
    if name == "packed_with_sinks":
        extras = [_doc_ids(1, 4096).cuda(), torch.randn(32, device="cuda", generator=g)]
    kernel = fn[name].compile(q, k, v, *extras)
    assert "_gluon_attention(" in kernel.source
    out = fn[name](q, k, v, *extras)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    with af.backend("reference"):
        q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
        ref = fn[name](q32, k32, v32, *extras)
        ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    for what, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads), strict=True):
        rel = ((got.float() - want).norm() / want.norm()).item()
        assert rel < 2e-2, f"{name} {what}: relative error {rel:.2e}"
