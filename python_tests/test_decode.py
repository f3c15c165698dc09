"""Decoding against a KV cache (`Variant.cache_keys`, `Variant.decode`) on CPU: the generated
decode kernels under the interpreter and the reference backend, against the contract: the last
Lq rows of the variant's ordinary call on each whole sequence (float64 reference), contiguous
and paged caches, lengths of 0 and 1 and off the tiles, unused cache slots holding NaN, every
variant family; and the errors of bad input."""

from __future__ import annotations

import math

import pytest
import torch
from variant_families import families, small_window

import attnfuse as af
from attnfuse import variants
from attnfuse.cache import interpreter_library, load_source
from attnfuse.compiler import compile_module
from attnfuse.inference import gather_cache

D = 32


def _families(hq: int) -> list[tuple[af.Variant, tuple]]:
    return families(hq, D, seed=7)


def _page_table(b: int, s: int, page: int, g: torch.Generator) -> torch.Tensor:
    """Shuffled pages for b sequences of capacity s, out of a pool with two spare pages."""
    per = -(-s // page)
    return torch.randperm(b * per + 2, generator=g)[: b * per].view(b, per).to(torch.int32)


def _paged(cache: torch.Tensor, table: torch.Tensor, page: int) -> torch.Tensor:
    """A contiguous cache [B, H, S, D] scattered over a pool [pages, page, H, D] by `table`
    (the pages it does not name hold NaN)."""
    b, h, _, d = cache.shape
    pool = torch.full((table.numel() + 2, page, h, d), float("nan"), dtype=cache.dtype)
    for i in range(b):
        for j in range(table.shape[1]):
            rows = cache[i, :, j * page : (j + 1) * page].transpose(0, 1)
            pool[table[i, j], : rows.shape[0]] = rows
    return pool


def _expected(var: af.Variant, q, k_raw, v, lens, extras) -> torch.Tensor:
    """Each sequence's ordinary call on its whole length (float64 reference): its last Lq rows."""
    rows = []
    for b, n in enumerate(lens):
        ex = [x[b : b + 1, :n] if x.dim() == 2 and not x.is_floating_point() else x for x in extras]
        with af.backend("reference"):
            rows.append(var(q[b : b + 1].double(), k_raw[b : b + 1, :, :n].double(), v[b : b + 1, :, :n].double(), *ex))
    return torch.cat(rows)


def _case(
    var, extras, *, lens, lq, hq=4, hkv=2, page=None, dtype=torch.float16, seed=0, backend="interpret", strided=False
):
    g = torch.Generator().manual_seed(seed)
    b, s = len(lens), max(max(lens), 1) + 5
    if page is not None:
        s = -(-s // page) * page
    q = torch.randn(b, hq, lq, D, generator=g).to(dtype)
    k_raw = torch.randn(b, hkv, s, D, generator=g).to(dtype)
    v = torch.randn(b, hkv, s, D, generator=g).to(dtype)
    k_cache = var.cache_keys(k_raw, torch.arange(s), *extras).clone()
    v_cache = v.clone()
    for i, n in enumerate(lens):  # slots past each length hold garbage
        k_cache[i, :, n:] = float("nan")
        v_cache[i, :, n:] = float("nan")
    table = None
    if page is not None:
        table = _page_table(b, s, page, g)
        k_cache, v_cache = _paged(k_cache, table, page), _paged(v_cache, table, page)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    if strided:  # views with other strides: the lengths every other element, the table column-major
        seqlens = torch.stack([seqlens, torch.full_like(seqlens, -1)], 1)[:, 0]
        table = None if table is None else table.t().contiguous().t()
    with af.backend(backend):
        out = var.decode(q, k_cache, v_cache, seqlens, *extras, page_table=table)
    want = _expected(var, q, k_raw, v, lens, extras)
    assert out.shape == want.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    tol = 2e-3 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), want, rtol=0, atol=tol)


@pytest.mark.parametrize("family", range(8))
def test_every_family_contiguous(family):
    var, extras = _families(4)[family]
    _case(var, extras, lens=[37, 1, 64], lq=2)


@pytest.mark.parametrize("family", [0, 2, 3, 5])
@pytest.mark.parametrize("page", [16, 64])
def test_every_family_paged(family, page):
    var, extras = _families(4)[family]
    _case(var, extras, lens=[70, 16, 3], lq=1, page=page)


@pytest.mark.parametrize("lq", [1, 5, 16])
def test_query_lengths_and_short_sequences(lq):
    """Lq up to 16, sequences shorter than Lq (queries at negative positions) and empty ones."""
    _case(variants.llama3, (), lens=[0, 1, lq + 9, 3], lq=lq, hq=2, hkv=1)


@pytest.mark.parametrize("page", [None, 16])
def test_strided_lengths_and_page_table(page):
    """Lengths and a page table given as strided views (an expanded scalar length is one, as a
    static cache's is): the same output as contiguous ones."""
    var, extras = _families(4)[0]
    _case(var, extras, lens=[9, 3, 20], lq=2, page=page, strided=True)


@pytest.mark.parametrize(("d", "dv"), [(16, 16), (48, 40), (80, 96)])
def test_head_dims(d, dv):
    """Head dims off the powers of two and Dv != D, GQA 2."""
    g = torch.Generator().manual_seed(d)
    q = torch.randn(2, 6, 2, d, generator=g).half()
    k = torch.randn(2, 3, 40, d, generator=g).half()
    v = torch.randn(2, 3, 40, dv, generator=g).half()
    lens = [40, 23]
    with af.backend("interpret"):
        out = variants.llama3.decode(q, variants.llama3.cache_keys(k, torch.arange(40)), v, torch.tensor(lens).int())
    assert out.shape == (2, 6, 2, dv)
    torch.testing.assert_close(out.double(), _expected(variants.llama3, q, k, v, lens, ()), rtol=0, atol=2e-2)


def test_no_gqa_and_float32():
    _case(variants.gemma2, (), lens=[50, 33], lq=3, hq=2, hkv=2, dtype=torch.float32)


def test_bfloat16_runs_the_float32_kernels():
    _case(variants.llama3, (), lens=[20, 9], lq=1, dtype=torch.bfloat16)


def test_reference_backend():
    _case(variants.gpt_oss, _families(4)[5][1], lens=[40, 0], lq=2, page=16, backend="reference")


def test_page_of_256_and_document_ids():
    g = torch.Generator().manual_seed(3)
    # Document ids cover the cache's capacity (two pages of 256).
    ids = torch.randint(0, 3, (2, 512), generator=g).sort(dim=1).values
    _case(variants.packed_documents, (ids,), lens=[295, 260], lq=2, page=256)


def test_several_splits_combine():
    """The decode module with a fixed split count (kernel-path `splits`): partials of several
    splits, some empty, merged by the combine kernel, sinks counted once."""
    g = torch.Generator().manual_seed(5)
    sinks = torch.randn(4, generator=g)
    q = torch.randn(2, 4, 2, D, generator=g).half()
    k = torch.randn(2, 2, 150, D, generator=g).half()
    v = torch.randn(2, 2, 150, D, generator=g).half()
    module = variants.gpt_oss.ir_module(q, k, v, sinks)
    compiled = compile_module(module, sm=0, direction="decode", decode_splits=4)
    assert "_decode_splits(q_shape[0] * 2, k_shape[2], 32, 2, 256, 4, q_device)" in compiled.source
    mod = load_source(compiled.source, _tmp(), interpret=True)
    lens = torch.tensor([150, 40], dtype=torch.int32)
    with interpreter_library():
        out, lse = mod.launch(q, variants.gpt_oss.cache_keys(k, torch.arange(150), sinks), v, sinks, lens)
    want = _expected(variants.gpt_oss, q, k, v, [150, 40], (sinks,))
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-2)
    assert lse.shape == (2, 4, 2) and torch.isfinite(lse).all()


def test_one_split_launches_the_single_kernel():
    """Where the cost model gives one split, the launcher runs `attn_decode_single` alone (the
    output and lse written directly, no workspaces, no combine): the same output and lse as
    three splits merged by the combine kernel, sinks included."""
    g = torch.Generator().manual_seed(6)
    sinks = torch.randn(4, generator=g)
    q = torch.randn(2, 4, 3, D, generator=g).half()
    k = torch.randn(2, 2, 300, D, generator=g).half()
    v = torch.randn(2, 2, 300, D, generator=g).half()
    keys = variants.gpt_oss.cache_keys(k, torch.arange(300), sinks)
    lens = torch.tensor([300, 70], dtype=torch.int32)
    module = variants.gpt_oss.ir_module(q, k, v, sinks)
    results = {}
    for splits in (1, 3):
        compiled = compile_module(module.clone(), sm=0, direction="decode", decode_splits=splits)
        assert "if splits == 1:" in compiled.source and "_launch(attn_decode_single" in compiled.source
        mod = load_source(compiled.source, _tmp(), interpret=True)
        with interpreter_library():
            results[splits] = mod.launch(q, keys, v, sinks, lens)
    (o1, lse1), (o3, lse3) = results[1], results[3]
    torch.testing.assert_close(o1, o3, rtol=0, atol=2e-3)
    torch.testing.assert_close(lse1, lse3, rtol=0, atol=1e-4)
    want = _expected(variants.gpt_oss, q, k, v, [300, 70], (sinks,))
    torch.testing.assert_close(o1.double(), want, rtol=0, atol=2e-2)


def _tmp():
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp(prefix="attnfuse-decode-"))


# ------------------------------------------------------------------------------ cache_keys


def test_cache_keys_is_the_rotation_at_given_positions():
    """cache_keys(k, positions) equals a plain RoPE formula at those positions, per batch row."""
    g = torch.Generator().manual_seed(1)
    k = torch.randn(2, 2, 5, D, generator=g)
    pos = torch.tensor([[3, 4, 5, 6, 7], [0, 10, 20, 30, 40]])
    got = variants.llama3.cache_keys(k, pos)
    inv = 1.0 / 500000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos[:, None, :, None].double() * inv
    x1, x2 = k[..., : D // 2].double(), k[..., D // 2 :].double()
    want = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)
    # Llama 3.1's frequency scaling changes the low frequencies only; compare the unscaled half.
    torch.testing.assert_close(got[..., :4].double(), want[..., :4], rtol=1e-5, atol=1e-5)
    assert variants.llama3.cache_keys(k, pos).dtype == k.dtype


def test_cache_keys_without_k_transforms_is_k():
    k = torch.randn(1, 2, 4, D)

    @af.variant
    def plain(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    assert plain.cache_keys(k, torch.arange(4)) is k


def test_cache_keys_norm_weight_and_sinks_trace():
    g = torch.Generator().manual_seed(2)
    wq, wk = torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5
    k = torch.randn(1, 2, 6, D, generator=g)
    got = variants.qwen3.cache_keys(k, torch.arange(6), wq, wk)
    normed = k * torch.rsqrt(k.square().mean(-1, keepdim=True) + 1e-6) * wk
    # A position-0 key is not rotated.
    torch.testing.assert_close(got[:, :, 0], normed[:, :, 0], rtol=1e-5, atol=1e-5)
    # gpt-oss's sinks fix the query heads: cache_keys finds a head count the trace accepts.
    assert variants.gpt_oss.cache_keys(k, torch.arange(6), torch.zeros(8)).shape == k.shape


# ------------------------------------------------------------------------------ append_kv


@pytest.mark.parametrize("page", [None, 16])
def test_append_kv_then_decode(page):
    """Prefill with append_kv (two sequences of 19 and 3 positions), append 2 more tokens each,
    decode them: the last rows of each sequence's ordinary call; the cache holds cache_keys of
    each position, and nothing past the lengths is written."""
    var, extras = _families(4)[1]  # Qwen3-style: QK-norm weights and RoPE on K
    g = torch.Generator().manual_seed(9)
    b, hkv, s = 2, 2, 48
    k_raw = torch.randn(b, hkv, 21, D, generator=g).half()
    v_raw = torch.randn(b, hkv, 21, D, generator=g).half()
    q = torch.randn(b, 4, 2, D, generator=g).half()
    if page is None:
        k_cache = torch.full((b, hkv, s, D), float("nan")).half()
        table = None
    else:  # pages in a scrambled order, the pool larger than needed
        k_cache = torch.full((8, page, hkv, D), float("nan")).half()
        table = torch.tensor([[5, 0, 7], [2, 6, 1]], dtype=torch.int32)
    v_cache = k_cache.clone()
    lens = torch.zeros(b, dtype=torch.int32)
    prompt = (19, 3)
    for i, n in enumerate(prompt):  # each sequence's prompt alone (batch 1 views of the caches)
        one = table[i : i + 1] if table is not None else None
        kc, vc = (k_cache, v_cache) if page else (k_cache[i : i + 1], v_cache[i : i + 1])
        got = var.append_kv(k_raw[i : i + 1, :, :n], v_raw[i : i + 1, :, :n], kc, vc, lens[i : i + 1], *extras,
                            page_table=one)  # fmt: skip
        assert got.tolist() == [n] and got.dtype == torch.int32
    lens = torch.tensor(prompt, dtype=torch.int32)
    new_k = torch.stack([k_raw[i, :, n : n + 2] for i, n in enumerate(prompt)])
    new_v = torch.stack([v_raw[i, :, n : n + 2] for i, n in enumerate(prompt)])
    lens = var.append_kv(new_k, new_v, k_cache, v_cache, lens, *extras, page_table=table)
    assert lens.tolist() == [21, 5]
    with af.backend("interpret"):
        out = var.decode(q, k_cache, v_cache, lens, *extras, page_table=table)
    full = [torch.cat([k_raw[i, :, :n], new_k[i]], 1)[None] for i, n in enumerate(prompt)]
    vals = [torch.cat([v_raw[i, :, :n], new_v[i]], 1)[None] for i, n in enumerate(prompt)]
    for i in range(b):
        want = _expected(var, q[i : i + 1], full[i], vals[i], [full[i].shape[2]], extras)
        torch.testing.assert_close(out[i : i + 1].double(), want, rtol=0, atol=2e-2)
        n = full[i].shape[2]
        held = gather_cache(k_cache, i, n, table)  # [Hkv, n, D]
        torch.testing.assert_close(held, var.cache_keys(full[i], torch.arange(n), *extras)[0])
    # Nothing past the lengths was written.
    if page is None:
        assert torch.isnan(k_cache[1, :, 5:]).all() and torch.isnan(v_cache[0, :, 21:]).all()
    else:
        assert torch.isnan(k_cache[[3, 4]]).all() and torch.isnan(k_cache[6, 5:]).all()


def test_append_kv_errors():
    k = torch.randn(2, 2, 3, D).half()
    cache = torch.zeros(2, 2, 8, D).half()
    lens = torch.tensor([4, 6], dtype=torch.int32)
    var = variants.llama3
    with pytest.raises(af.AttnFuseError, match=r"cache_seqlens \+ L must lie in \[0, 8\]"):
        var.append_kv(k, k, cache, cache.clone(), lens)
    with pytest.raises(af.AttnFuseError, match=r"append_kv: cache_seqlens must lie in \[0, 8\]"):
        var.append_kv(k, k, cache, cache.clone(), torch.tensor([-1, 0], dtype=torch.int32))
    with pytest.raises(af.AttnFuseError, match="do not hold k"):
        var.append_kv(k, k, cache[:, :1], cache[:, :1].clone(), lens - 4)
    with pytest.raises(af.AttnFuseError, match="k_cache has dtype torch.float32 but k has torch.float16"):
        var.append_kv(k, k, cache.float(), cache.float(), lens - 4)
    with pytest.raises(af.AttnFuseError, match="must agree in all but the last dim"):
        var.append_kv(k, k[:, :, :2], cache, cache.clone(), lens - 4)
    pool = torch.zeros(4, 16, 2, D).half()
    with pytest.raises(af.AttnFuseError, match="append_kv: page_table points outside the pool of 4 pages"):
        var.append_kv(k, k, pool, pool.clone(), lens, page_table=torch.tensor([[0], [4]], dtype=torch.int32))


# ------------------------------------------------------------------------------ errors


def _inputs(lens=(4, 2), page=None):
    q = torch.randn(2, 4, 1, D).half()
    if page is None:
        k = torch.randn(2, 2, 8, D).half()
        return q, k, k.clone(), torch.tensor(lens, dtype=torch.int32), None
    pool = torch.randn(4, page, 2, D).half()
    return q, pool, pool.clone(), torch.tensor(lens, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "seqlens": torch.tensor([9, 1], dtype=torch.int32)}, r"cache_seqlens must lie in \[0, 8\]"),
        (lambda a: {**a, "seqlens": torch.tensor([-1, 1], dtype=torch.int32)}, r"must lie in \[0, 8\]"),
        (lambda a: {**a, "seqlens": torch.tensor([1.0, 2.0])}, "cache_seqlens must be an int32 tensor"),
        (lambda a: {**a, "seqlens": torch.tensor([1], dtype=torch.int32)}, r"shape \[B\] = \[2\]"),
        (lambda a: {**a, "q": torch.randn(2, 4, 17, D).half()}, "decode takes 1 to 16"),
        (lambda a: {**a, "q": torch.randn(2, 3, 1, D).half()}, "not a multiple of the cache's 2 KV heads"),
        (lambda a: {**a, "k": a["k"].float()}, "k_cache has dtype torch.float32 but q has torch.float16"),
        (lambda a: {**a, "k": a["k"][:, :, :, :16]}, "k_cache has head dim 16 but q has 32"),
        (lambda a: {**a, "k": a["k"][:1], "v": a["v"][:1]}, "k_cache has batch size 1 but q has 2"),
    ],
)
def test_bad_contiguous_input(change, message):
    q, k, v, seqlens, _ = _inputs()
    a = change({"q": q, "k": k, "v": v, "seqlens": seqlens})
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match=message):
        variants.llama3.decode(a["q"], a["k"], a["v"], a["seqlens"])


def test_bad_paged_input():
    q, pool, vpool, seqlens, table = _inputs(lens=(16, 3), page=16)
    with af.backend("interpret"):
        with pytest.raises(af.AttnFuseError, match="page_table points outside the pool of 4 pages"):
            variants.llama3.decode(q, pool, vpool, seqlens, page_table=torch.tensor([[4], [0]], dtype=torch.int32))
        with pytest.raises(af.AttnFuseError, match="page_table must be an int32 tensor"):
            variants.llama3.decode(q, pool, vpool, seqlens, page_table=table.long())
        with pytest.raises(af.AttnFuseError, match=r"cache_seqlens must lie in \[0, 16\]"):
            variants.llama3.decode(q, pool, vpool, torch.tensor([17, 1], dtype=torch.int32), page_table=table)
        odd = torch.randn(4, 24, 2, D).half()
        with pytest.raises(af.AttnFuseError, match="page size .* must be one of"):
            variants.llama3.decode(q, odd, odd, seqlens, page_table=table)
        # An unused entry may hold anything: only pages below cache_seqlens are checked.
        table2 = torch.tensor([[1], [-5]], dtype=torch.int32)
        out = variants.llama3.decode(q, pool, vpool, torch.tensor([5, 0], dtype=torch.int32), page_table=table2)
        assert torch.isfinite(out).all() and (out[1] == 0).all()


def test_decode_needs_no_gradient():
    q, k, v, seqlens, _ = _inputs()
    q.requires_grad_(True)
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match="inference-only"):
        variants.llama3.decode(q, k, v, seqlens)
    with torch.no_grad(), af.backend("interpret"):
        assert variants.llama3.decode(q, k, v, seqlens).shape == (2, 4, 1, D)


def test_cache_keys_bad_positions():
    k = torch.randn(1, 2, 4, D)
    with pytest.raises(af.AttnFuseError, match=r"positions must have shape \[N\] = \[4\]"):
        variants.llama3.cache_keys(k, torch.arange(5))
    with pytest.raises(af.AttnFuseError, match="integer tensor"):
        variants.llama3.cache_keys(k, torch.arange(4.0))


def test_unused_slots_are_never_read():
    """A cache of NaN past every length (and an all-NaN second sequence of length 0) gives finite
    outputs, zeros for the empty sequence."""
    q, k, v, _, _ = _inputs()
    k[:, :, 3:] = math.nan
    v[:, :, 3:] = math.nan
    with af.backend("interpret"):
        out = variants.mistral.decode(q, k, v, torch.tensor([3, 0], dtype=torch.int32))
    assert torch.isfinite(out).all() and (out[1] == 0).all()


# ------------------------------------------------------------------------------ sm 90, no GPU


@pytest.mark.parametrize(("page", "family"), [(None, 5), (16, 3), (128, 2)])
def test_decode_kernels_compile_for_sm90(page, family, tmp_path):
    """The decode and combine kernels of a variant compile for sm 90 on the CPU (Triton's compiler
    and ptxas) with the tiling's launch shape, within the shared memory of one SM: contiguous, small
    pages and pages of a block or more."""
    from kernel_harness import compile_for_sm90

    var, extras = _families(8)[family]
    q = torch.zeros(2, 8, 1, 128, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 512, 128, dtype=torch.bfloat16)
    extras = tuple(
        x.to(torch.bfloat16) if x.is_floating_point() and x.dim() == 1 and x.numel() == D else x for x in extras
    )
    if family == 3:  # QK-norm weights of the head dim
        extras = (torch.ones(128), torch.ones(128))
    module = var.ir_module(q, k, k, *extras)
    source = compile_module(module, sm=90, direction="decode", page_size=page or 0).source
    mod = load_source(source, tmp_path, interpret=False)
    calls = []
    mod._launch = lambda kernel, grid, warps, stages, *a: calls.append((kernel, warps, stages, a))
    lens = torch.tensor([300, 7], dtype=torch.int32)
    paged = (torch.zeros(2, 512 // page, dtype=torch.int32),) if page else ()
    cache = torch.zeros(8, page, 2, 128, dtype=torch.bfloat16) if page else k
    mod.launch(q, cache, cache, *extras, lens, *paged)
    names = set()
    for kernel, warps, stages, a in calls:
        binary = compile_for_sm90(kernel, a, num_warps=warps, num_stages=stages)
        assert binary.metadata.shared <= 232448, (kernel.__name__, binary.metadata.shared)  # sm 90's 227 KiB
        names.add(kernel.__name__)
    assert names == {"attn_decode", "attn_decode_combine"}


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_torch_compile_fullgraph():
    """Under torch.compile a decode call is one attnfuse::decode node: fullgraph traces it, the
    result equals the eager call's, and new lengths need no new trace."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 4, 1, D, generator=g).half()
    pool = torch.randn(6, 16, 2, D, generator=g).half()
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    sinks = torch.randn(4, generator=g)
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    def step(q, pool, lens, sinks):
        return variants.gpt_oss.decode(q, pool, pool, lens, sinks, page_table=table) * 2

    compiled = torch.compile(step, fullgraph=True)
    with af.backend("interpret"):
        for lens in ([40, 17], [3, 48]):
            lens = torch.tensor(lens, dtype=torch.int32)
            eager = variants.gpt_oss.decode(q, pool, pool, lens, sinks, page_table=table)
            torch.testing.assert_close(compiled(q, pool, lens, sinks), 2 * eager, rtol=0, atol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 1


def test_signature_includes_the_kv_heads():
    """Two calls that differ only in the cache's KV heads (same query heads) take their own kernels."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 1, D, generator=g).half()
    lens = torch.tensor([20], dtype=torch.int32)
    with af.backend("interpret"):
        for hkv in (2, 4, 1):
            k = torch.randn(1, hkv, 24, D, generator=g).half()
            out = variants.mistral.decode(q, variants.mistral.cache_keys(k, torch.arange(24)), k, lens)
            with af.backend("reference"):
                want = variants.mistral(q.double(), k[:, :, :20].double(), k[:, :, :20].double())
            torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-2)


@pytest.mark.parametrize("lq", [1, 3])
@pytest.mark.parametrize("page", [None, 16])
def test_lengths_around_the_tiles(lq, page):
    """Cached lengths around the interpreter's 32-key blocks and a page's 16 keys (15-17, 31-33,
    63-65), with a 20-key window crossing block edges (kv_segments' full and partial blocks),
    every length in one batch."""
    lens = [15, 16, 17, 31, 32, 33, 63, 64, 65]
    _case(small_window, (), lens=lens, lq=lq, hq=2, hkv=1, page=page)
