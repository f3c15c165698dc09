"""Every bad input gets an `af.AttnFuseError` (a ValueError) naming the argument or
construct and what was expected; nothing is launched."""

from __future__ import annotations

import math

import pytest
import torch

import attnfuse as af


def t(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape).to(dtype=dtype, device=device)


@af.variant
def plain_causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def alibi_variant(q, k, v, slopes):
    return af.pv(af.softmax(af.bias(af.qk(q, k), af.alibi(slopes))), v)


@af.variant
def doc_variant(q, k, v, ids):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.document(ids))), v)


Q, K, V = t(2, 4, 5, 16), t(2, 2, 7, 16), t(2, 2, 7, 8)


def test_is_a_value_error():
    assert issubclass(af.AttnFuseError, ValueError)


@pytest.mark.parametrize(
    "args, message",
    [
        ((t(4, 5, 16), K, V), r"q must have rank 4 \[B, H, N, D\], got shape \[4, 5, 16\]"),
        ((Q, t(2, 2, 7, 16, 1), V), r"k must have rank 4 \[B, H, N, D\], got shape \[2, 2, 7, 16, 1\]"),
        ((Q, K, [1, 2]), r"v must be a torch.Tensor \[B, H, N, D\], got list"),
        ((Q, t(3, 2, 7, 16), V), r"k has batch size 3 but q has 2"),
        ((Q, K, t(1, 2, 7, 8)), r"v has batch size 1 but q has 2"),
        ((Q, t(2, 2, 7, 32), V), r"k has head dim 32 but q has 16: q and k must share the head dim"),
        ((Q, K, t(2, 2, 6, 8)), r"v has 6 kv positions \(dim 2\) but k has 7"),
        ((Q, K, t(2, 1, 7, 8)), r"v has 1 heads but k has 2"),
        ((t(2, 3, 5, 16), K, V), r"q has 3 heads, which is not a multiple of k's 2 heads"),
        (
            (Q.to(torch.complex64), K, V),
            r"q has dtype torch.complex64; expected torch.float16, torch.bfloat16 or torch.float32 \(or torch.float64 "
            r"on the reference backend\)",
        ),
        ((Q, K.half(), V), r"k has dtype torch.float16 but q has torch.float32: q, k and v must share a dtype"),
        ((Q, K, V.to(torch.int32)), r"v has dtype torch.int32; expected"),
        ((Q, K.to("meta"), V), r"k is on meta but q is on cpu: all tensors must be on one device"),
    ],
    ids=[
        "q-rank",
        "k-rank",
        "v-not-tensor",
        "k-batch",
        "v-batch",
        "head-dim",
        "kv-length",
        "v-heads",
        "gqa-multiple",
        "dtype-complex",
        "mixed-dtype",
        "int-dtype",
        "device",
    ],
)
def test_qkv_errors(args, message):
    with pytest.raises(af.AttnFuseError, match=message):
        plain_causal(*args)


def test_errors_also_on_the_hot_path():
    plain_causal(Q, K, V)  # warm: the next calls hit the cache entry for this signature
    with pytest.raises(af.AttnFuseError, match="k has batch size 1 but q has 2"):
        plain_causal(Q, t(1, 2, 7, 16), t(1, 2, 7, 8))
    with pytest.raises(af.AttnFuseError, match="v has 8 kv positions"):
        plain_causal(Q, K, t(2, 2, 8, 8))


def test_argument_count():
    with pytest.raises(af.AttnFuseError, match=r"variant alibi_variant\(q, k, v, slopes\) takes 4 arguments, got 3"):
        alibi_variant(Q, K, V)
    with pytest.raises(af.AttnFuseError, match=r"plain_causal\(q, k, v\) takes 3 arguments, got 4"):
        plain_causal(Q, K, V, Q)


def test_extra_tensor_shape_dtype_and_device():
    with pytest.raises(
        af.AttnFuseError, match=r"slopes \(af.alibi slopes \(one per query head\)\) must have shape \[4\], got \[3\]"
    ):
        alibi_variant(Q, K, V, torch.ones(3))  # first call: found while tracing
    alibi_variant(Q, K, V, torch.ones(4))
    with pytest.raises(af.AttnFuseError, match=r"must have shape \[4\], got \[5\]"):
        alibi_variant(Q, K, V, torch.ones(5))  # later calls: found by the signature's check
    with pytest.raises(
        af.AttnFuseError, match=r"slopes \(af.alibi slopes \(one per query head\)\) must be a float tensor"
    ):
        alibi_variant(Q, K, V, torch.ones(4, dtype=torch.int32))
    with pytest.raises(af.AttnFuseError, match=r"slopes has dtype torch.float64; extra tensors must be"):
        alibi_variant(Q, K, V, torch.ones(4, dtype=torch.float64))
    with pytest.raises(af.AttnFuseError, match=r"slopes is on meta but q is on cpu"):
        alibi_variant(Q, K, V, torch.ones(4, device="meta"))


def test_document_ids_shape():
    ids = torch.zeros(2, 7, dtype=torch.int32)
    doc_variant(Q, K, V, ids)
    with pytest.raises(
        af.AttnFuseError,
        match=r"ids must have size 7 \(the kv length\) in dim 1 \(document ids \[B, Nk\]\), got shape \[2, 6\]",
    ):
        doc_variant(Q, K, V, ids[:, :6])
    with pytest.raises(af.AttnFuseError, match=r"ids must have size 2 \(the batch size\) in dim 0"):
        doc_variant(Q, K, V, torch.zeros(3, 7, dtype=torch.int32))
    with pytest.raises(
        af.AttnFuseError,
        match=r"af.document ids \(ids\) must be an integer tensor \[B, Nk\] \(torch.int32 or torch.int64\), "
        r"got a 2-d torch.float32",
    ):
        doc_variant(Q, K, V, torch.zeros(2, 7))


def test_custom_indexed_extra_too_small():
    @af.variant
    def table_bias(q, k, v, table):
        return af.pv(af.softmax(af.bias(af.qk(q, k), lambda b, h, qi, kv: table[h, kv])), v)

    table_bias(Q, K, V, torch.zeros(4, 7))
    table_bias(Q, K, V, torch.zeros(5, 9))  # larger is fine: only read where indexed
    with pytest.raises(
        af.AttnFuseError, match=r"table must have at least size 7 \(the kv length\) in dim 1 \(indexed with kv_idx\)"
    ):
        table_bias(Q, K, V, torch.zeros(4, 6))
    with pytest.raises(af.AttnFuseError, match=r"table must have at least size 4 \(q's head count\) in dim 0"):
        table_bias(Q, K, V, torch.zeros(3, 7))


def test_unhashable_constant_argument():
    @af.variant
    def with_const(q, k, v, w):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.sliding_window(w))), v)

    with pytest.raises(af.AttnFuseError, match="w must be a tensor or a hashable constant"):
        with_const(Q, K, V, [3])


def test_backend_names(monkeypatch):
    with pytest.raises(
        af.AttnFuseError,
        match=r"af.backend 'cuda' is not a backend; expected one of auto, triton, interpret, reference",
    ):
        with af.backend("cuda"):
            pass
    monkeypatch.setenv("ATTNFUSE_BACKEND", "fast")
    with pytest.raises(af.AttnFuseError, match=r"ATTNFUSE_BACKEND= 'fast' is not a backend"):
        plain_causal(Q, K, V)
    with af.backend("reference"):  # the context manager wins over the environment
        plain_causal(Q, K, V)


def test_triton_backend_needs_cuda_tensors():
    with (
        af.backend("triton"),
        pytest.raises(af.AttnFuseError, match="backend 'triton' runs on CUDA tensors, but q is on cpu"),
    ):
        plain_causal(Q, K, V)


def test_interpret_backend_names_a_numpy_it_cannot_run_with(monkeypatch):
    import numpy

    @af.variant
    def softcapped_causal(q, k, v):  # its own kernel, so no other test has it in memory
        return af.pv(af.softmax(af.softcap(af.mask(af.qk(q, k), af.causal), 37.5)), v)

    monkeypatch.setattr(numpy, "__version__", "2.4.1")
    with (
        af.backend("interpret"),
        pytest.raises(af.AttnFuseError, match=r"needs numpy < 2.4, and this process has numpy 2.4.1"),
    ):
        softcapped_causal(Q, K, V)


def test_float64_runs_on_the_reference_backend_only():
    """float64 is computed in float64 by the reference backend (for gradcheck); the kernels
    compute in float32 and refuse it, naming the backend that runs it."""
    q, k, v = (x.double() for x in (Q, K, V))
    out = plain_causal(q, k, v)  # auto on CPU tensors: the reference backend
    assert out.dtype == torch.float64
    message = r"q, k and v are float64, which the interpret backend does not run .*af.backend\('reference'\)"
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match=message):
        plain_causal(q, k, v)
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match=message):
        plain_causal.compile(q, k, v)
    with pytest.raises(af.AttnFuseError, match=r"slopes has dtype torch.float64; .*\(or float64 in a float64 call\)"):
        alibi_variant(Q, K, V, torch.ones(4, dtype=torch.float64))


# --------------------------------------------------------------------------- tracing errors


def traced(body, *extras):
    """Trace a variant whose scores are `body(s, *extras)`."""

    def fn(q, k, v, *rest):
        return af.pv(af.softmax(body(af.qk(q, k), *rest)), v)

    names = ["q", "k", "v", *[f"x{i}" for i in range(len(extras))]]
    src = f"lambda {', '.join(names)}: fn({', '.join(names)})"
    return af.variant(eval(src, {"fn": fn}), name="traced")(Q, K, V, *extras)


@pytest.mark.parametrize(
    "body, message",
    [
        (
            lambda s: af.mask(s, lambda b, h, qi, kv: qi >= kv and kv > 2),
            r"no concrete truth value while tracing: Python's `and`, `or`, `not`, `if`",
        ),
        (lambda s: af.mask(s, lambda b, h, qi, kv: (qi >= kv) or (kv > 2)), r"use `&`, `|`, `~` and af.where"),
        (lambda s: af.mask(s, lambda b, h, qi, kv: not qi), r"no concrete truth value"),
        (lambda s: af.bias(s, lambda b, h, qi, kv: 1.0 if qi > kv else 0.0), r"no concrete truth value"),
        (lambda s: af.mask(s, lambda b, h, qi, kv: 0 <= qi - kv < 4), r"chained comparisons"),
        (lambda s: af.score_mod(s, lambda x, b, h, qi, kv: math.exp(x)), r"cannot become a Python float; use af.exp"),
        (
            lambda s: af.bias(s, lambda b, h, qi, kv: torch.arange(4)[h]),
            r"IndexError: .* elements of the variant's tensor arguments",
        ),
        (
            lambda s: af.mask(s, lambda b, h, qi, kv: qi - kv),
            r"must return a boolean \(a comparison, or & \| ~ of comparisons\)",
        ),
        (lambda s: af.mask(s, lambda qi, kv: qi >= kv), r"must take \(b, h, q_idx, kv_idx\)"),
        (lambda s: af.score_mod(s, lambda s, b, h, qi: s), r"must take \(score, b, h, q_idx, kv_idx\)"),
        (lambda s: af.bias(s, lambda b, h, qi, kv: (qi * 1.0) // 2), r"// needs integer operands"),
        (lambda s: af.bias(s, lambda b, h, qi, kv: ~(qi * 0.5)), r"~ needs a boolean or an integer, got a float"),
        (
            lambda s: af.bias(s, lambda b, h, qi, kv: qi + 2**40),
            r"integer constant 1099511627776 .* does not fit in i32",
        ),
        (lambda s: af.bias(s, lambda b, h, qi, kv: qi + "a"), r"a str cannot be used in a traced function"),
        (lambda s: af.bias(s, "alibi"), r"af.bias expects af.alibi\(slopes\) or a callable"),
        (lambda s: af.mask(s, 3), r"a mask predicate must be af.causal"),
        (lambda s: af.softcap(s, 0.0), r"af.softcap cap must be a number in \(0, 3.402823e\+38\] .*got 0.0"),
        (lambda s: af.softcap(s, "big"), r"af.softcap cap must be a number in \(0, .*got 'big' \(a str\)"),
        (
            lambda s: af.mask(s, af.sliding_window(0)),
            r"af.sliding_window\(w\) must be an integer in \[1, 2147483647\] .*, got 0",
        ),
        (
            lambda s: af.mask(s, af.prefix_lm(-1)),
            r"af.prefix_lm\(n\) must be an integer in \[0, 2147483647\] .*, got -1",
        ),
        (lambda s: af.rope(s), r"af.rope expects q, k or v .*, got <scores: \[B, 4, Nq, Nk\]>"),
        (lambda s: s * 2, r"modify scores with af.scale, af.mask"),
        (lambda s: af.softmax(s), r"af.pv expects the result of af.softmax|af.softmax expects scores"),
    ],
)
def test_tracing_errors(body, message):
    with pytest.raises(af.AttnFuseError, match=message):
        traced(body)


def test_tracing_errors_with_extras():
    ids = torch.zeros(2, 7, dtype=torch.int32)
    with pytest.raises(af.AttnFuseError, match=r"x0 has 2 dims and needs 2 indices, got 1"):
        traced(lambda s, x: af.mask(s, lambda b, h, qi, kv: x[kv] == 0), ids)
    with pytest.raises(af.AttnFuseError, match=r"index 1 of x0 must be an integer, got a float"):
        traced(lambda s, x: af.mask(s, lambda b, h, qi, kv: x[b, kv * 0.5] == 0), ids)
    with pytest.raises(af.AttnFuseError, match=r"index 0 of x0 must be >= 0, got -1"):
        traced(lambda s, x: af.mask(s, lambda b, h, qi, kv: x[-1, kv] == 0), ids)
    with pytest.raises(af.AttnFuseError, match=r"slices are not supported"):
        traced(lambda s, x: af.mask(s, lambda b, h, qi, kv: x[:, kv] == 0), ids)
    with pytest.raises(af.AttnFuseError, match=r"is a tensor: index it to read an element"):
        traced(lambda s, x: af.bias(s, lambda b, h, qi, kv: x + 1), ids)
    captured = torch.zeros(2, 7, dtype=torch.int32)
    with pytest.raises(
        af.AttnFuseError, match=r"af.document ids must be a tensor argument of the variant .* not a tensor captured"
    ):
        traced(lambda s: af.mask(s, af.document(captured)))
    with pytest.raises(af.AttnFuseError, match=r"af.mask cannot be used inside af.mask predicate <lambda>"):
        traced(lambda s: af.mask(s, lambda b, h, qi, kv: af.mask(s, af.causal)))
    with pytest.raises(af.AttnFuseError, match=r"indexing x0 is only meaningful inside a custom mask"):
        traced(lambda s, x: af.scale(s, 1.0) if x[0, 0] else s, ids)


def test_tracing_errors_pre_matmul():
    def run(fn):
        return af.variant(fn)(Q, K, V)

    with pytest.raises(
        af.AttnFuseError,
        match=r"af.rope rotary_dim must be an even integer in \[2, 16\] \(q's head dim\), got 5",
    ):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.rope(q, rotary_dim=5), k)), v))
    with pytest.raises(af.AttnFuseError, match=r"af.rope theta must be a number in \(0, .*got -1.0"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.rope(q, theta=-1.0), k)), v))
    with pytest.raises(af.AttnFuseError, match=r"af.rope style must be 'half' or 'interleaved', got 'neox'"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.rope(q, style="neox"), k)), v))
    with pytest.raises(af.AttnFuseError, match=r"unknown rope scaling type 'dynamic'"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.rope(q, scaling={"type": "dynamic", "factor": 2}), k)), v))
    with pytest.raises(af.AttnFuseError, match=r"yarn rope scaling parameter truncate must be True or False, got 0"):
        af.rope_scaling({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "truncate": 0})
    with pytest.raises(af.AttnFuseError, match=r"yarn rope scaling needs original_max_position"):
        af.rope_scaling({"rope_type": "yarn", "factor": 32.0})
    with pytest.raises(af.AttnFuseError, match=r"llama3 rope scaling has no parameter 'beta_fast'"):
        af.rope_scaling({"rope_type": "llama3", "factor": 8.0, "beta_fast": 2.0})
    with pytest.raises(af.AttnFuseError, match=r"llama3 rope scaling needs high_freq_factor > low_freq_factor > 0"):
        af.llama3_scaling(low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(af.AttnFuseError, match=r"variant '<lambda>'|variant 'variant' must return the result of af.pv"):
        run(lambda q, k, v: af.qk(q, k))
    with pytest.raises(af.AttnFuseError, match=r"af.pv expects the result of af.softmax, got <scores"):
        run(lambda q, k, v: af.pv(af.qk(q, k), v))
    with pytest.raises(af.AttnFuseError, match=r"transform q and k with af.rope, af.qk_norm and af.scale"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(q * 2, k)), v))
    with pytest.raises(af.AttnFuseError, match=r"while tracing variant .*: NameError"):
        run(lambda q, k, v: undefined_name)  # noqa: F821


def test_blocks_outside_a_variant():
    with pytest.raises(af.AttnFuseError, match=r"af.rope works on the symbolic tensors of a variant being traced"):
        af.rope(Q)
    assert af.exp(0.0) == 1.0 and af.where(True, 1, 2) == 1  # plain numbers pass through


def test_variant_function_signature():
    with pytest.raises(
        af.AttnFuseError, match=r"a variant function takes \(q, k, v, \*extras\) as plain positional parameters"
    ):
        af.variant(lambda q, k: None)
    with pytest.raises(af.AttnFuseError, match=r"plain positional parameters"):
        af.variant(lambda q, k, v, *extras: None)


def test_compile_module_options():
    """An unknown pipeline option is an AttnFuseError that names it and lists the known ones; a
    bad value is the stage's error naming the option."""
    from kernel_harness import variant

    from attnfuse.compiler import compile_module
    from attnfuse.ir import parse_module

    module = parse_module(variant(dtype=torch.float16, hq=2, hkv=2, d=16))
    with pytest.raises(af.AttnFuseError, match=r"unknown pipeline options \['tahn'\]; it takes \[.*'tanh'"):
        compile_module(module, sm=90, tahn="approx")
    with pytest.raises(ValueError, match="kernel-path tanh must be one of auto, approx, exact, got 'fast'"):
        compile_module(module, sm=90, tanh="fast")
    assert "_fast_tanh" not in compile_module(module, sm=90, tanh="approx").source  # no tanh to approximate
    with pytest.raises(af.AttnFuseError, match=r"wrt=\(0,\) needs direction='bwd'"):
        compile_module(module, sm=90, wrt=(0,))
