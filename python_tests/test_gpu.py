"""Generated kernels on a CUDA GPU, compiled for its SM version, against the reference
executor in float64 on the CPU (same inputs), in bf16 and fp16.

- The bundled Llama-3 example (RoPE with llama3 scaling, causal, GQA 32/8, D=128) in
  both rope-fusion modes, at N=1000 (not a multiple of any tile) and at decode (Nq=1).
- Each variant family at a small shape: causal, sliding window, prefix-LM, softcap,
  ALiBi, sinks, document mask, QK-norm+RoPE and partial interleaved RoPE (both modes),
  Nq != Nk.
- The runtime on the `triton` backend: gradients (eagerly and under torch.compile), degenerate
  shapes (no keys, no queries, B = 0), first calls from several threads at once, and a
  kernel read back from the disk cache.
- 64-bit addressing: a KV cache of more than 2^31 elements (B=5, H=32, N=128k, D=128
  bf16; 11 GB for k and v, 16 GB with K's rotated copy), causal with and without RoPE,
  the whole batch and a slice holding its last element, against SDPA in float32.
- Out-of-range indices: a table read past its end and integer division by zero.

(The named variants of `attnfuse.variants` have their GPU test in test_variants.py.)
All tests are marked `gpu` and skipped without CUDA. On the GPU machine:

    python -m pytest -m gpu python_tests -q      (or: python python_tests/test_gpu.py)
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from kernel_harness import variant

import attnfuse
import attnfuse as af
from attnfuse import runtime
from attnfuse.cache import load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.reference import run_reference, run_reference_with_lse
from attnfuse.runtime import device_sm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EXAMPLE = Path(attnfuse.__file__).resolve().parent / "examples" / "llama3_rope_causal.mlir"
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# |out - ref| <= TOL (1 + |ref|): 16-bit inputs, Q (after its prologue) and P rounded to
# the input type before the dots, fp32 accumulation; bf16 keeps 8 mantissa bits, fp16 11.
TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """out (any device, 16-bit) against the float64 reference, elementwise."""
    out = out.detach().double().cpu()
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(out).all(), f"{what}: non-finite values in the kernel's output"
    tol = TOL[dtype]
    err = ((out - ref).abs() - tol * ref.abs()).max().item()
    assert err <= tol, f"{what}: max |out - ref| - tol |ref| = {err:.3e} > {tol:.0e}"


def check_kernel(ir: str, args: list[torch.Tensor], folder: Path, **options) -> None:
    """Compile `ir` for this GPU, run it on CUDA copies of `args` (CPU tensors) and compare
    output and log-sum-exp with the reference executor run on `args` themselves."""
    dtype = args[0].dtype
    nk = args[1].shape[2]
    compiled = compile_module(parse_module(ir), sm=device_sm(), seq_len=nk, **options)
    kern = load_source(compiled.source, folder, interpret=False)
    out, lse = kern.launch(*(a.cuda() for a in args))
    torch.cuda.synchronize()
    ref, ref_lse = run_reference_with_lse(ir, *args)
    assert out.dtype == dtype
    assert_matches(out, ref, dtype, f"output {options}")
    # log-sum-exp: fp32 in the kernel, off by the scores' rounding only
    finite = torch.isfinite(ref_lse)
    lse = lse.double().cpu()
    assert torch.equal(torch.isfinite(lse), finite), "lse: -inf rows differ from the reference"
    lse_err = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    assert lse_err <= TOL[dtype], f"lse: max error {lse_err:.3e}"


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu_kernels")


# ----------------------------------------------------------------------------- the example


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("rope_mode", ["fused", "prerotate"])
@pytest.mark.parametrize("nq,nk", [(1000, 1000), (1, 1000)], ids=["prefill-1000", "decode-1"])
def test_llama3_example(dtype_name: str, rope_mode: str, nq: int, nk: int, folder: Path) -> None:
    dtype = DTYPES[dtype_name]
    ir = EXAMPLE.read_text().replace("bf16", dtype_name)
    q = randn(1, 32, nq, 128, dtype=dtype, seed=nq)
    k = randn(1, 8, nk, 128, dtype=dtype, seed=nk + 1)
    v = randn(1, 8, nk, 128, dtype=dtype, seed=nk + 2)
    check_kernel(ir, [q, k, v], folder, rope_mode=rope_mode)


# ----------------------------------------------------------------------------- variant families

HQ, HKV, D, B = 4, 2, 64, 2


def build_ir(e: str, **pieces) -> str:
    """attn IR of `f(q, k, v, *extras)` at HQ/HKV x D in element type `e` (kernel_harness.variant)."""
    return variant(dtype=DTYPES[e], hq=HQ, hkv=HKV, d=D, **pieces)


ROPE = "attn.rope {x} half theta = 10000.0 rotary_dim = 64"
ROPE_PARTIAL = "attn.rope {x} interleaved theta = 10000.0 rotary_dim = 32"
CAUSAL = "attn.mask {s} causal"


def doc_ids(n: int) -> torch.Tensor:
    """Document ids [B, n]: documents of uneven lengths, different per batch row."""
    ids = torch.zeros(B, n, dtype=torch.int32)
    for b, cuts in enumerate(([37, 120, 121, 260], [5, 190])):
        for c in cuts:
            ids[b, c:] += 1
    return ids


# name -> (pieces of build_ir, builder of the extra tensors (dtype, n) -> list, or None)
FAMILIES = {
    "causal": (dict(score_ops=[CAUSAL]), None),
    "sliding_window": (dict(score_ops=["attn.mask {s} sliding_window(64)"]), None),
    "prefix_lm": (dict(score_ops=["attn.mask {s} prefix_lm(50)"]), None),
    "softcap": (dict(score_ops=["attn.softcap {s} cap = 30.0", CAUSAL]), None),
    "alibi": (
        dict(score_ops=[f"attn.bias {{s}} alibi(%sl : tensor<{HQ}xf32>)", CAUSAL], extras=[f"%sl: tensor<{HQ}xf32>"]),
        lambda dtype, n: [torch.tensor([0.5, 0.25, 0.125, 0.0625])],
    ),
    "sinks": (
        dict(score_ops=[CAUSAL], softmax=f"sink(%sk : tensor<{HQ}xf32>)", extras=[f"%sk: tensor<{HQ}xf32>"]),
        lambda dtype, n: [torch.tensor([0.0, 1.5, -2.0, 4.0])],
    ),
    "document": (
        dict(score_ops=[CAUSAL, "attn.mask {s} document(%ids : tensor<?x?xi32>)"], extras=["%ids: tensor<?x?xi32>"]),
        lambda dtype, n: [doc_ids(n)],
    ),
    "qknorm_rope": (
        dict(
            q_ops=["attn.norm {x} eps = 1.0e-06 weight(%qw : tensor<64x{E}>)", ROPE],
            k_ops=["attn.norm {x} eps = 1.0e-06 weight(%kw : tensor<64x{E}>)", ROPE],
            score_ops=[CAUSAL],
            extras=["%qw: tensor<64x{E}>", "%kw: tensor<64x{E}>"],
        ),
        lambda dtype, n: [(1 + 0.2 * randn(D, dtype=torch.float32, seed=s)).to(dtype) for s in (5, 6)],
    ),
    "rope_partial_interleaved": (dict(q_ops=[ROPE_PARTIAL], k_ops=[ROPE_PARTIAL], score_ops=[CAUSAL]), None),
}
ROPE_FAMILIES = {"qknorm_rope", "rope_partial_interleaved"}
CASES = [(name, mode) for name in FAMILIES for mode in (("fused", "prerotate") if name in ROPE_FAMILIES else ("auto",))]


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("family,rope_mode", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_variant_family(family: str, rope_mode: str, dtype_name: str, folder: Path) -> None:
    dtype = DTYPES[dtype_name]
    pieces, make_extras = FAMILIES[family]
    n = 300
    ir = build_ir(dtype_name, **pieces)
    q, k, v = (randn(*s, dtype=dtype, seed=i) for i, s in enumerate([(B, HQ, n, D), (B, HKV, n, D), (B, HKV, n, D)]))
    extras = make_extras(dtype, n) if make_extras else []
    check_kernel(ir, [q, k, v, *extras], folder, rope_mode=rope_mode)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("nq", [1, 17, 128])
def test_fewer_queries_than_keys(nq: int, dtype_name: str, folder: Path) -> None:
    """Queries are the last Nq of Nk=300 positions (decode and chunked prefill), with RoPE."""
    dtype = DTYPES[dtype_name]
    ir = build_ir(dtype_name, q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL])
    q = randn(B, HQ, nq, D, dtype=dtype, seed=1)
    k, v = randn(B, HKV, 300, D, dtype=dtype, seed=2), randn(B, HKV, 300, D, dtype=dtype, seed=3)
    check_kernel(ir, [q, k, v], folder)


def test_repeated_launches(folder: Path) -> None:
    """Launches after the first run the compiled binary directly (`_launch` in the generated
    module): new tensors, new lengths (new integer arguments), views whose data pointer is
    not 16-byte aligned (another specialisation) and the same call under a Triton launch
    hook (which takes Triton's own path) all still match the reference."""
    import triton

    dtype = torch.float16
    ir = build_ir("f16", q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL])
    compiled = compile_module(parse_module(ir), sm=device_sm(), seq_len=256, rope_mode="prerotate")
    kern = load_source(compiled.source, folder, interpret=False)

    def run_and_check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, what: str) -> None:
        out, _ = kern.launch(q, k, v)
        torch.cuda.synchronize()
        ref, _ = run_reference_with_lse(ir, q.cpu(), k.cpu(), v.cpu())
        assert_matches(out, ref, dtype, what)

    for seed, n in [(1, 256), (2, 256), (3, 200), (4, 256)]:
        q, k, v = (randn(B, h, n, D, dtype=dtype, seed=seed + i).cuda() for i, h in enumerate([HQ, HKV, HKV]))
        run_and_check(q, k, v, f"call seed={seed} n={n}")
    assert kern._BINARIES, "no binary was cached for direct launches"
    # One element of offset: the data pointers are 2 bytes past a 16-byte boundary.
    big = [randn(B * h * 130 * D + 1, dtype=dtype, seed=9 + i).cuda() for i, h in enumerate([HQ, HKV, HKV])]
    q, k, v = (t[1:].view(B, h, 130, D) for t, h in zip(big, [HQ, HKV, HKV], strict=True))
    assert q.data_ptr() % 16 != 0
    run_and_check(q, k, v, "misaligned views")
    run_and_check(q, k, v, "misaligned views, again")
    seen: list[object] = []
    triton.knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        run_and_check(q, k, v, "with a launch hook")
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(seen.append)
    assert len(seen) == 2, "a launch hook must see both launches (rotate_k and attn_fwd)"


# ----------------------------------------------------------------------------- the runtime on the triton backend


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty kernel cache folder; nothing of earlier tests in memory."""
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    runtime.clear_caches()
    yield tmp_path / "cache"
    runtime.clear_caches()


@af.variant
def rope_causal(q, k, v):
    q = af.rope(q, theta=10000.0)
    k = af.rope(k, theta=10000.0)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def causal_sink(q, k, v, sink):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal), sink=sink), v)


def cuda_qkv(b: int = B, nq: int = 200, nk: int = 200, dtype: torch.dtype = torch.float16, seed: int = 0):
    shapes = [(b, HQ, nq, D), (b, HKV, nk, D), (b, HKV, nk, D)]
    return [randn(*s, dtype=dtype, seed=seed + i).cuda() for i, s in enumerate(shapes)]


def test_device_sm() -> None:
    major, minor = torch.cuda.get_device_capability()
    assert device_sm() == device_sm("cuda") == device_sm(torch.cuda.current_device()) == major * 10 + minor
    assert device_sm("cpu") == 0


GRAD_TOL = {torch.float16: 6e-3, torch.bfloat16: 3e-2}
"""Relative L2 error of each gradient against float64 autograd (issue 11: fp16 6e-3; bf16
keeps 3 fewer mantissa bits)."""


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_triton_backend_gradients_and_torch_compile(dtype_name: str, fresh_cache: Path) -> None:
    """Gradients of every input requiring grad (q, k, v and the sink; RoPE + causal with
    GQA) against float64 autograd of the reference executor on the CPU, eagerly and
    under torch.compile(fullgraph=True)."""
    dtype = DTYPES[dtype_name]
    q, k, v = (t.requires_grad_() for t in cuda_qkv(nq=150, nk=200, dtype=dtype))
    sink = torch.tensor([0.0, 1.5, -2.0, 4.0], device="cuda", requires_grad=True)
    dout = randn(B, HQ, 150, D, dtype=dtype, seed=9).cuda()

    def oracle(variant, *args):
        xs = [a.detach().cpu().double().requires_grad_() for a in args]
        out = run_reference(variant.ir_module(*args), *xs, compute_dtype=torch.float64)
        return torch.autograd.grad(out, xs, dout.cpu().double())

    def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
        return ((x.detach().cpu().double() - ref).norm() / ref.norm()).item()

    with af.backend("triton"):
        for variant, args in [(rope_causal, (q, k, v)), (causal_sink, (q, k, v, sink))]:
            for run in [variant, torch.compile(lambda *a, f=variant: f(*a) * 1.0, fullgraph=True)]:
                grads = torch.autograd.grad(run(*args), args, dout)
                for name, a, g, ref in zip("q k v sink".split(), args, grads, oracle(variant, *args), strict=False):
                    assert g.dtype == a.dtype and g.shape == a.shape
                    assert rel_l2(g, ref) < GRAD_TOL[dtype], f"{variant.__name__} d{name}"


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_degenerate_shapes_on_the_gpu(dtype_name: str, fresh_cache: Path) -> None:
    """No keys: zeros, lse -inf or the sink's logit; no queries or B = 0: an empty output."""
    dtype = DTYPES[dtype_name]
    sink = torch.tensor([0.0, 1.5, -2.0, 4.0], device="cuda")
    with af.backend("triton"):
        q, k, v = cuda_qkv(nk=0, dtype=dtype)
        out, lse = causal_sink.compile(q, k, v, sink).run_with_lse(q, k, v, sink)
        assert out.shape == (B, HQ, 200, D) and not out.any()
        torch.testing.assert_close(lse, sink.view(1, HQ, 1).expand(B, HQ, 200))
        out = rope_causal(q, k, v)
        assert out.shape == (B, HQ, 200, D) and not out.any()
        _, lse = rope_causal.compile(q, k, v).run_with_lse(q, k, v)
        assert torch.isneginf(lse).all()
        for shape in (dict(nq=0), dict(nq=0, nk=0), dict(b=0)):
            q, k, v = cuda_qkv(dtype=dtype, **shape)
            out = rope_causal(q, k, v)
            assert out.numel() == 0 and out.shape == (shape.get("b", B), HQ, shape.get("nq", 200), D)
        torch.cuda.synchronize()


def test_threads_making_their_first_triton_calls_at_once(fresh_cache: Path) -> None:
    n_threads = 4
    inputs = [cuda_qkv(nq=100 + 50 * i, nk=300, seed=10 * i) for i in range(n_threads)]
    ir = rope_causal.ir(*inputs[0])
    start, failures = threading.Barrier(n_threads), []

    def work(i: int) -> None:
        try:
            start.wait(timeout=60)
            with af.backend("triton"):
                for _ in range(3):
                    out = rope_causal(*inputs[i])
                    torch.cuda.synchronize()
                    ref, _ = run_reference_with_lse(ir, *(t.cpu() for t in inputs[i]))
                    assert_matches(out, ref, torch.float16, f"thread {i}")
        except Exception as e:
            failures.append(f"thread {i}: {e!r}"[:500])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert failures == []
    assert af.runtime.stats()["compiles"] >= 1


def test_a_kernel_read_back_from_the_disk_cache(fresh_cache: Path) -> None:
    q, k, v = cuda_qkv()
    ir = rope_causal.ir(q, k, v)
    ref, _ = run_reference_with_lse(ir, q.cpu(), k.cpu(), v.cpu())
    with af.backend("triton"):
        rope_causal(q, k, v)
        runtime.clear_caches()  # as a new process: the kernel file is on disk
        loads = af.runtime.stats()["disk_loads"]
        for _ in range(2):
            out = rope_causal(q, k, v)
            torch.cuda.synchronize()
            assert_matches(out, ref, torch.float16, "disk entry")
        assert af.runtime.stats()["disk_loads"] == loads + 1


# ----------------------------------------------------------------------------- 64-bit offsets (issue 10, item 3)

# A KV cache of B=5, H=32, N=128k, D=128 in bf16: 2.7e9 elements (5.4 GB) per tensor, past
# 2^31, so b * stride(0) overflows int32 from the fourth batch element on.
BIG_B, BIG_H, BIG_N, BIG_D, BIG_NQ = 5, 32, 131072, 128, 16
ROPE_128 = "attn.rope {x} half theta = 10000.0 rotary_dim = 128"


@pytest.fixture(scope="module")
def big_cache() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """q [5, 32, 16, 128] and k, v [5, 32, 131072, 128] bf16 on the GPU (11 GB). v's channel 0
    is b * 32 + h and its channel 1 the key's position / N, so a read from the wrong
    batch, head or row changes the output; q is scaled so that attention is peaked."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (BIG_B, BIG_H, BIG_N, BIG_D)
    k = torch.empty(shape, dtype=torch.bfloat16, device="cuda").normal_(generator=g)
    v = torch.empty(shape, dtype=torch.bfloat16, device="cuda").normal_(generator=g)
    v[..., 0] = (torch.arange(BIG_B, device="cuda")[:, None] * BIG_H + torch.arange(BIG_H, device="cuda")).view(
        BIG_B, BIG_H, 1
    )
    v[..., 1] = torch.arange(BIG_N, device="cuda") / BIG_N
    q = (2 * torch.randn(BIG_B, BIG_H, BIG_NQ, BIG_D, device="cuda", generator=g)).to(torch.bfloat16)
    assert k.numel() > 2**31
    yield q, k, v
    del q, k, v
    torch.cuda.empty_cache()


def rope_half(x: torch.Tensor, first_pos: int) -> torch.Tensor:
    """Half-style RoPE (theta 10000, all 128 channels) of x [H, N, D] at positions
    first_pos.., in float32 (angles in float64)."""
    n, d = x.shape[-2], x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angle = torch.arange(first_pos, first_pos + n, dtype=torch.float64, device=x.device)[:, None] * inv_freq
    cos, sin = angle.cos().float(), angle.sin().float()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def big_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: bool) -> torch.Tensor:
    """Causal attention of one batch element (q [H, Nq, D], k, v [H, N, D]) in float32 on
    the GPU, queries at the last Nq positions: SDPA's math with an explicit mask."""
    nq, n = q.shape[1], k.shape[1]
    qf, kf = q.float(), k.float()
    if rope:
        qf, kf = rope_half(qf, n - nq), rope_half(kf, 0)
    keep = torch.arange(n, device=q.device)[None, :] <= torch.arange(n - nq, n, device=q.device)[:, None]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(qf, kf, v.float(), attn_mask=keep)


@pytest.mark.parametrize("rope_mode", [None, "prerotate", "fused"], ids=["causal", "rope-prerotate", "rope-fused"])
def test_tensor_past_2_31_elements(big_cache: tuple[torch.Tensor, ...], rope_mode: str | None, folder: Path) -> None:
    """Causal attention (with RoPE: both K placements) over a KV cache of more than 2^31
    elements, the whole batch and a slice holding its last element, against SDPA."""
    q, k, v = big_cache
    rope = rope_mode is not None
    ir = variant(
        dtype=torch.bfloat16,
        hq=BIG_H,
        hkv=BIG_H,
        d=BIG_D,
        q_ops=[ROPE_128] if rope else [],
        k_ops=[ROPE_128] if rope else [],
        score_ops=[CAUSAL],
    )
    options = {"rope_mode": rope_mode} if rope else {}
    compiled = compile_module(parse_module(ir), sm=device_sm(), seq_len=BIG_N, **options)
    kern = load_source(compiled.source, folder, interpret=False)
    out, _ = kern.launch(q, k, v)
    last, _ = kern.launch(q[-1:], k[-1:], v[-1:])  # a batch slice: its own base pointer
    torch.cuda.synchronize()
    tol = TOL[torch.bfloat16]
    for b in range(BIG_B):
        ref = big_reference(q[b], k[b], v[b], rope).double()
        err = ((out[b].double() - ref).abs() - tol * ref.abs()).max().item()
        assert err <= tol, f"batch element {b}: max |out - ref| - tol |ref| = {err:.3e}"
        if b == BIG_B - 1:
            err = ((last[0].double() - ref).abs() - tol * ref.abs()).max().item()
            assert err <= tol, f"the slice k[{b}:]: max |out - ref| - tol |ref| = {err:.3e}"
    channel0 = (torch.arange(BIG_B, device="cuda")[:, None] * BIG_H + torch.arange(BIG_H, device="cuda")).double()
    assert torch.allclose(out[..., 0].double(), channel0[..., None].expand(-1, -1, BIG_NQ), rtol=1e-2)
    del out, last


# ----------------------------------------------------------------------------- out-of-range indices (item 4)


@af.variant
def next_key_bias(q, k, v, tab):
    s = af.bias(af.qk(q, k), lambda b, h, q_idx, kv_idx: tab[h, kv_idx + 1])
    return af.pv(af.softmax(s), v)


@af.variant
def modulo_by_zero(q, k, v):
    s = af.score_mod(
        af.qk(q, k), lambda x, b, h, q_idx, kv_idx: x + (q_idx // (kv_idx % 3)) * 0.1 + (q_idx % (kv_idx % 3)) * 0.01
    )
    return af.pv(af.softmax(s), v)


def test_out_of_range_indices_on_the_gpu(fresh_cache: Path) -> None:
    """A table read one key past its end (0 there) and integer // and % by zero
    (x // 0 = 0, x % 0 = x) give the reference's answer on the triton backend."""
    q, k, v = cuda_qkv(nq=100, nk=200)
    tab = torch.randn(HQ, 200, device="cuda")
    for fn, args in ((next_key_bias, (q, k, v, tab)), (modulo_by_zero, (q, k, v))):
        ref, _ = run_reference_with_lse(fn.ir(*args), *(a.cpu() for a in args))
        with af.backend("triton"):
            out = fn(*args)
        torch.cuda.synchronize()
        assert_matches(out, ref, torch.float16, fn.__name__)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-m", "gpu", *sys.argv[1:]]))
