"""Gradients of every building block and every named variant, against float64 autograd
(issue 11, "Tests").

For each case, a backend's gradients of q, k, v and of the differentiable extras (QK-norm
weights, softmax sinks) are compared, by relative L2 error (fp32 3e-4, fp16 6e-3), with two
float64 oracles computed on the same rounded inputs and the same output gradient:

1. autograd through an independent formula written with `plain_attention.py`;
2. autograd through the reference executor (`attnfuse.reference`) on the variant's IR.

The two oracles must agree with each other to 1e-9, which checks the oracles themselves.
Only the inputs that require grad may get a gradient; the others keep `.grad` None.

Backends: `reference` (eager PyTorch, differentiated by autograd) and `interpret` (the
generated forward and backward Triton kernels under the interpreter, on CPU). Every case
runs on both and none is skipped: a backend that refuses a gradient it should give (its
"has no backward yet" error, say) fails the case. The gradients the compiler does not form
(attn-autodiff: ALiBi slopes, document ids, a custom region's extra tensor, an explicit
inv_freq) are an AttnFuseError naming the argument, checked as such below ("gradients that
are refused"), never a skip.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import plain_attention as plain
import pytest
import torch
from test_variants import NAMES
from test_variants import expected as variant_formula
from test_variants import inputs as variant_inputs

import attnfuse as af
from attnfuse import variants
from attnfuse.reference import run_reference

F64 = torch.float64
BACKENDS = ["reference", "interpret"]
DTYPES = [torch.float32, torch.float16]
TOLERANCE = {torch.float32: 3e-4, torch.float16: 6e-3}
"""Relative L2 error of each gradient (and of the output) against float64 autograd (issue 11)."""
ORACLE_AGREEMENT = 1e-9
"""Relative L2 distance allowed between the two float64 oracles."""
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")


# --------------------------------------------------------------------------- backends


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """A private kernel cache folder for this module's interpreted kernels."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("grad-cache")))
        yield


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


# --------------------------------------------------------------------------- running and comparing


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (0 when both are zero)."""
    x, ref = x.detach().to(F64), ref.detach().to(F64)
    diff = (x - ref).norm().item()
    scale = ref.norm().item()
    return diff / scale if scale > 0 else diff


def _leaves(args: Sequence[object], names: Sequence[str], wants: set[str], dtype: torch.dtype | None) -> list:
    """Fresh leaf copies of `args` (cast to `dtype` when given), requiring grad where named in `wants`."""
    out = []
    for name, a in zip(names, args, strict=True):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a = a.detach().clone() if dtype is None else a.detach().to(dtype)
            a.requires_grad_(name in wants)
        out.append(a)
    return out


def _grads(fn: Callable[..., torch.Tensor], leaves: Sequence[object], names: Sequence[str], dout: torch.Tensor):
    """(out, whether out is on the autograd graph, {name: .grad}) of fn(*leaves) back-propagated
    from `dout`."""
    out = fn(*leaves)
    on_graph = out.grad_fn is not None
    if out.requires_grad:
        out.backward(dout.to(out.dtype))
    return (
        out.detach(),
        on_graph,
        {n: a.grad for n, a in zip(names, leaves, strict=True) if isinstance(a, torch.Tensor)},
    )


@dataclass
class GradResult:
    """A backend's output and gradients, and the two oracles'."""

    out: torch.Tensor
    on_graph: bool
    grads: dict[str, torch.Tensor | None]
    oracles: list[tuple[str, torch.Tensor, dict[str, torch.Tensor | None]]] = field(default_factory=list)


def compute(
    variant: af.Variant,
    formula: Callable[..., torch.Tensor],
    args: Sequence[object],
    wants: set[str],
    backend: str,
    seed: int = 7,
) -> GradResult:
    """Run `variant` on `backend` with the inputs named in `wants` requiring grad, back-propagate a
    random output gradient, and do the same in float64 through `formula` and the reference executor."""
    names = variant.arg_names[: len(args)]
    q, v = args[0], args[2]
    assert isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor)
    gen = torch.Generator().manual_seed(seed)
    dout = torch.randn(*q.shape[:3], v.shape[3], generator=gen).to(q.dtype)

    def run(*xs):
        with af.backend(backend):
            return variant(*xs)

    result = GradResult(*_grads(run, _leaves(args, names, wants, None), names, dout))
    module = variant.ir_module(*args)

    def reference(*xs):
        return run_reference(module, *[x for x in xs if isinstance(x, torch.Tensor)], compute_dtype=F64)

    for label, fn in (("formula", formula), ("reference", reference)):
        o, _, g = _grads(fn, _leaves(args, names, wants, F64), names, dout.to(F64))
        result.oracles.append((label, o, g))
    return result


def _grad_failures(name: str, grad, oracles: Sequence[torch.Tensor | None], tol: float) -> list[str]:
    """What is wrong with the gradient `grad` of `name` against the oracles' (formula, reference)."""
    gf, gr = oracles
    assert gf is not None and gr is not None, f"oracle without d{name}"
    failures = []
    if rel_l2(gf, gr) > ORACLE_AGREEMENT:
        failures.append(f"oracles disagree on d{name}: rel-L2 {rel_l2(gf, gr):.2e}")
    if grad is None:
        return [*failures, f"d{name}: None, but {name} requires grad"]
    if grad.shape != gr.shape or not torch.isfinite(grad).all():
        return [*failures, f"d{name}: shape {list(grad.shape)} (want {list(gr.shape)}) or not finite"]
    errs = [rel_l2(grad, gr), rel_l2(grad, gf)]
    if not max(errs) <= tol:
        failures.append(
            f"d{name}: rel-L2 {errs[0]:.2e} vs reference, {errs[1]:.2e} vs formula > {tol:g} "
            f"(|d{name}| = {gr.norm().item():.3g})"
        )
    return failures


def check(result: GradResult, wants: set[str], dtype: torch.dtype, what: str) -> None:
    """Assert the oracles agree, every wanted gradient is within the dtype's tolerance of both and
    finite, and the others are None; the message lists every failure with its error."""
    tol = TOLERANCE[dtype]
    failures = []
    if result.on_graph != bool(wants):
        failures.append(f"out {'has' if result.on_graph else 'has no'} grad_fn, but {sorted(wants)} require grad")
    (_, out_f, grads_f), (_, out_r, grads_r) = result.oracles
    if rel_l2(out_f, out_r) > ORACLE_AGREEMENT:
        failures.append(f"oracles disagree on out: rel-L2 {rel_l2(out_f, out_r):.2e}")
    err = rel_l2(result.out, out_r)
    if not err <= tol:
        failures.append(f"out: rel-L2 {err:.2e} > {tol:g}")
    for name, grad in result.grads.items():
        if name in wants:
            failures += _grad_failures(name, grad, (grads_f[name], grads_r[name]), tol)
        elif grad is not None:
            failures.append(f"d{name}: a gradient, but {name} does not require grad")
    assert not failures, f"{what}:\n  " + "\n  ".join(failures)


# --------------------------------------------------------------------------- cases: one block each


class Shape(NamedTuple):
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    dv: int


GQA = Shape(2, 4, 2, 24, 40, 32, 32)  # GQA 2:1, Nq != Nk
ODD = Shape(1, 3, 1, 33, 33, 24, 24)  # head dim 24, GQA 3:1, N = 33 (not a multiple of 16)
MHA = Shape(2, 2, 2, 48, 48, 16, 16)  # no GQA, N = 48
DV = Shape(1, 4, 1, 7, 45, 32, 16)  # Dv != D, few queries
DECODE = Shape(2, 4, 2, 1, 37, 16, 16)  # one query


def qkv(shape: Shape, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, nq, nk, d, dv = shape
    q = torch.randn(b, hq, nq, d, generator=gen)
    k = torch.randn(b, hkv, nk, d, generator=gen)
    v = torch.randn(b, hkv, nk, dv, generator=gen)
    return tuple(x.to(dtype) for x in (q, k, v))


@dataclass(frozen=True)
class Case:
    """A variant, its float64 formula, the shape, its extra tensors (built from the shape
    and a generator) and which arguments require grad."""

    variant: af.Variant
    formula: Callable[..., torch.Tensor]
    shape: Shape
    extras: Callable[[Shape, torch.Generator], tuple] = lambda shape, gen: ()
    grads: tuple[str, ...] = ("q", "k", "v")


def pos(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return plain.positions(q.shape[2], k.shape[2])


def grids(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return plain.index_grids(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _plain_attention(q, k, v):
    return af.pv(af.softmax(af.qk(q, k)), v)


def _qk_scale(q, k, v):
    return af.pv(af.softmax(af.qk(q, k, scale=0.3)), v)


def _scale_pre(q, k, v):
    return af.pv(af.softmax(af.qk(af.scale(q, 1.5), af.scale(k, -0.7))), v)


def _scale_post(q, k, v):
    return af.pv(af.softmax(af.mask(af.scale(af.qk(q, k), 0.5), af.causal)), v)


def _rope_variant(q_kw: dict, k_kw: dict | None = None) -> af.Variant:
    def roped(q, k, v):
        return af.pv(af.softmax(af.qk(af.rope(q, **q_kw), af.rope(k, **(k_kw or q_kw)))), v)

    return af.variant(roped)


def _rope_formula(inv: Callable[[int], tuple[torch.Tensor, float]], style="half", k_style=None, k_inv=None):
    """Plain RoPE attention: `inv(d)` gives (inv_freq, magnitude) for head dim d."""

    def formula(q, k, v):
        qp, kp = pos(q, k)
        fq, mq = inv(q.shape[-1])
        fk, mk = (k_inv or inv)(k.shape[-1])
        rq = plain.rope(q, qp, fq, style, mq)
        rk = plain.rope(k, kp, fk, k_style or style, mk)
        return plain.finish(plain.scores(rq, rk), v)

    return formula


@af.variant
def _rope_inv_freq(q, k, v, freqs):
    q = af.rope(q, rotary_dim=8, inv_freq=freqs)
    k = af.rope(k, rotary_dim=8, inv_freq=freqs)
    return af.pv(af.softmax(af.qk(q, k)), v)


def _rope_inv_freq_formula(q, k, v, freqs):
    qp, kp = pos(q, k)
    return plain.finish(plain.scores(plain.rope(q, qp, freqs), plain.rope(k, kp, freqs)), v)


@af.variant
def _norm_weight(q, k, v, w):
    return af.pv(af.softmax(af.qk(af.qk_norm(q, w, eps=1e-5), af.qk_norm(k))), v)


@af.variant
def _norm_no_weight(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(af.qk_norm(q), af.qk_norm(k, eps=1e-4)), af.causal)), v)


@af.variant
def _norm_rope_scale(q, k, v, wq, wk):
    q = af.scale(af.rope(af.qk_norm(q, wq), theta=1000.0), 0.8)
    k = af.rope(af.qk_norm(k, wk), theta=1000.0)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def _norm_rope_scale_formula(q, k, v, wq, wk):
    qp, kp = pos(q, k)
    inv = plain.default_inv_freq(1000.0, q.shape[-1])
    rq = 0.8 * plain.rope(plain.rms_norm(q, wq), qp, inv)
    rk = plain.rope(plain.rms_norm(k, wk), kp, inv)
    return plain.finish(plain.scores(rq, rk), v, plain.causal_keep(q.shape[2], k.shape[2]))


def _weights(n: int):
    """Extras: `n` float32 QK-norm weights [D] in [0.5, 1.5)."""

    def make(shape: Shape, gen: torch.Generator) -> tuple:
        return tuple(torch.rand(shape.d, generator=gen) + 0.5 for _ in range(n))

    return make


def _masked(pred) -> af.Variant:
    def masked(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(q, k), pred)), v)

    return af.variant(masked)


def _keep_formula(keep: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    def formula(q, k, v, *extras):
        return plain.finish(plain.scores(q, k), v, keep(q, k, *extras))

    return formula


@af.variant
def _document(q, k, v, ids):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.document(ids))), v)


def _doc_ids(shape: Shape, gen: torch.Generator) -> tuple:
    return ((torch.rand(shape.b, shape.nk, generator=gen) < 0.12).cumsum(1).to(torch.int32),)


def _custom_pred(b, h, qi, kv):
    return (kv % 3 != 0) | (kv == qi)


def _custom_keep(q, k):
    _, _, qp, kp = grids(q, k)
    return (kp % 3 != 0) | (kp == qp)


def _empty_rows_keep(q, k):
    qp, kp = pos(q, k)
    return plain.causal_keep(q.shape[2], k.shape[2]) & (qp[:, None] < 30)


@af.variant
def _alibi(q, k, v, slopes):
    return af.pv(af.softmax(af.mask(af.bias(af.qk(q, k), af.alibi(slopes)), af.causal)), v)


def _alibi_formula(q, k, v, slopes):
    nq, nk = q.shape[2], k.shape[2]
    s = plain.scores(q, k) + plain.alibi_bias(slopes, nq, nk)
    return plain.finish(s, v, plain.causal_keep(nq, nk))


def _slopes(shape: Shape, gen: torch.Generator) -> tuple:
    return (af.alibi_slopes(shape.hq),)


@af.variant
def _bias_custom(q, k, v):
    return af.pv(af.softmax(af.bias(af.qk(q, k), lambda b, h, qi, kv: (kv - qi) * 0.0625 + h * 0.5)), v)


def _bias_custom_formula(q, k, v):
    _, h, qp, kp = grids(q, k)
    return plain.finish(plain.scores(q, k) + ((kp - qp) * 0.0625 + h * 0.5).to(F64), v)


@af.variant
def _bias_table(q, k, v, table):
    return af.pv(af.softmax(af.bias(af.qk(q, k), lambda b, h, qi, kv: table[h, kv % 4])), v)


def _bias_table_formula(q, k, v, table):
    _, h, _, kp = grids(q, k)
    return plain.finish(plain.scores(q, k) + table.to(F64)[h, kp % 4], v)


def _table(shape: Shape, gen: torch.Generator) -> tuple:
    return (torch.randn(shape.hq, 4, generator=gen),)


@af.variant
def _softcap(q, k, v):
    return af.pv(af.softmax(af.softcap(af.scale(af.qk(q, k), 1.5), 2.0)), v)


def _softcap_formula(q, k, v):
    return plain.finish(plain.softcap(1.5 * plain.scores(q, k), 2.0), v)


def _score_mod(fn) -> af.Variant:
    def modded(q, k, v):
        return af.pv(af.softmax(af.score_mod(af.qk(q, k), fn)), v)

    return af.variant(modded)


def _score_mod_formula(fn):
    def formula(q, k, v):
        return plain.finish(fn(plain.scores(q, k), *grids(q, k)), v)

    return formula


def _mod_tanh(s, b, h, qi, kv):
    return af.tanh(s * 0.5) * 3.0 + s * 0.25


def _mod_tanh_plain(s, b, h, qi, kv):
    return torch.tanh(s * 0.5) * 3.0 + s * 0.25


def _mod_square(s, b, h, qi, kv):
    return s * s * 0.5 - s


def _mod_where(s, b, h, qi, kv):
    return af.where(kv % 2 == 0, s * 2.0, af.sigmoid(s) - 1.0) + h * 0.125


def _mod_where_plain(s, b, h, qi, kv):
    return torch.where(kv % 2 == 0, s * 2.0, torch.sigmoid(s) - 1.0) + h * 0.125


@af.variant
def _mod_weight(q, k, v, head_weight):
    return af.pv(af.softmax(af.score_mod(af.qk(q, k), lambda s, b, h, qi, kv: s * head_weight[h])), v)


def _mod_weight_formula(q, k, v, head_weight):
    _, h, _, _ = grids(q, k)
    return plain.finish(plain.scores(q, k) * head_weight.to(F64)[h], v)


def _head_weight(shape: Shape, gen: torch.Generator) -> tuple:
    return (torch.rand(shape.hq, generator=gen) + 0.5,)


@af.variant
def _sink(q, k, v, sink):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.sliding_window(5)), sink=sink), v)


def _sink_formula(q, k, v, sink):
    return plain.finish(plain.scores(q, k), v, plain.sliding_window_keep(q.shape[2], k.shape[2], 5), sink)


@af.variant
def _sink_empty_rows(q, k, v, sink):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal & (lambda b, h, qi, kv: qi < 40)), sink=sink), v)


def _sink_empty_rows_formula(q, k, v, sink):
    nq, nk = q.shape[2], k.shape[2]
    qp, _ = pos(q, k)
    return plain.finish(plain.scores(q, k), v, plain.causal_keep(nq, nk) & (qp[:, None] < 40), sink)


def _sinks(shape: Shape, gen: torch.Generator) -> tuple:
    return (torch.randn(shape.hq, generator=gen),)


_LLAMA3_64 = {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 64}

CASES: dict[str, Case] = {
    # qk, pv, scale
    "plain": Case(af.variant(_plain_attention), lambda q, k, v: plain.finish(plain.scores(q, k), v), GQA),
    "decode": Case(af.variant(_plain_attention), lambda q, k, v: plain.finish(plain.scores(q, k), v), DECODE),
    "qk_scale_dv": Case(af.variant(_qk_scale), lambda q, k, v: plain.finish(plain.scores(q, k, 0.3), v), DV),
    "scale_pre": Case(
        af.variant(_scale_pre), lambda q, k, v: plain.finish(plain.scores(1.5 * q.double(), -0.7 * k.double()), v), ODD
    ),
    "scale_post": Case(
        af.variant(_scale_post),
        lambda q, k, v: plain.finish(0.5 * plain.scores(q, k), v, plain.causal_keep(q.shape[2], k.shape[2])),
        MHA,
    ),
    # rope
    "rope_half": Case(
        _rope_variant({"theta": 10000.0}), _rope_formula(lambda d: (plain.default_inv_freq(10000.0, d), 1.0)), GQA
    ),
    "rope_interleaved_partial": Case(
        _rope_variant({"theta": 100.0, "style": "interleaved", "rotary_dim": 16}),
        _rope_formula(lambda d: (plain.default_inv_freq(100.0, 16), 1.0), "interleaved"),
        ODD,
    ),
    "rope_half_partial": Case(
        _rope_variant({"theta": 500.0, "rotary_dim": 8}),
        _rope_formula(lambda d: (plain.default_inv_freq(500.0, 8), 1.0)),
        DV,
    ),
    "rope_linear": Case(
        _rope_variant({"theta": 50.0, "scaling": af.linear_scaling(4.0)}),
        _rope_formula(lambda d: (plain.linear_inv_freq(50.0, d, 4.0), 1.0)),
        MHA,
    ),
    "rope_llama3": Case(
        _rope_variant({"theta": 50.0, "scaling": _LLAMA3_64}),
        _rope_formula(lambda d: (plain.llama3_inv_freq(50.0, d, 4.0, original=64.0), 1.0)),
        GQA,
    ),
    "rope_yarn": Case(
        _rope_variant({"theta": 50.0, "scaling": af.yarn_scaling(8.0, 16)}),
        _rope_formula(lambda d: plain.yarn_inv_freq(50.0, d, 8.0, 16.0)),
        ODD,
    ),
    "rope_inv_freq": Case(
        _rope_inv_freq, _rope_inv_freq_formula, MHA, lambda shape, gen: (torch.tensor([1.0, 0.3, 0.05, 0.01]),)
    ),
    "rope_q_k_differ": Case(
        _rope_variant({"theta": 10000.0}, {"theta": 300.0, "style": "interleaved", "rotary_dim": 16}),
        _rope_formula(
            lambda d: (plain.default_inv_freq(10000.0, d), 1.0),
            k_style="interleaved",
            k_inv=lambda d: (plain.default_inv_freq(300.0, 16), 1.0),
        ),
        GQA,
    ),
    # qk_norm
    "qk_norm_weight": Case(
        _norm_weight,
        lambda q, k, v, w: plain.finish(plain.scores(plain.rms_norm(q, w, 1e-5), plain.rms_norm(k)), v),
        GQA,
        _weights(1),
        ("q", "k", "v", "w"),
    ),
    "qk_norm_no_weight": Case(
        _norm_no_weight,
        lambda q, k, v: plain.finish(
            plain.scores(plain.rms_norm(q), plain.rms_norm(k, eps=1e-4)), v, plain.causal_keep(q.shape[2], k.shape[2])
        ),
        ODD,
    ),
    "qk_norm_rope_scale": Case(
        _norm_rope_scale, _norm_rope_scale_formula, DV, _weights(2), ("q", "k", "v", "wq", "wk")
    ),
    # masks
    "mask_causal": Case(_masked(af.causal), _keep_formula(lambda q, k: plain.causal_keep(q.shape[2], k.shape[2])), ODD),
    "mask_sliding_window": Case(
        _masked(af.sliding_window(7)),
        _keep_formula(lambda q, k: plain.sliding_window_keep(q.shape[2], k.shape[2], 7)),
        GQA,
    ),
    "mask_prefix_lm": Case(
        _masked(af.prefix_lm(20)), _keep_formula(lambda q, k: plain.prefix_lm_keep(q.shape[2], k.shape[2], 20)), MHA
    ),
    "mask_document": Case(
        _document, _keep_formula(lambda q, k, ids: plain.document_keep(ids, q.shape[2])), GQA, _doc_ids
    ),
    "mask_custom": Case(_masked(_custom_pred), _keep_formula(_custom_keep), DV),
    "mask_empty_rows": Case(_masked(af.causal & (lambda b, h, qi, kv: qi < 30)), _keep_formula(_empty_rows_keep), GQA),
    # bias, softcap, score_mod
    "bias_alibi": Case(_alibi, _alibi_formula, GQA, _slopes),
    "bias_custom": Case(_bias_custom, _bias_custom_formula, ODD),
    "bias_custom_table": Case(_bias_table, _bias_table_formula, MHA, _table),
    "softcap": Case(_softcap, _softcap_formula, GQA),
    "score_mod_tanh": Case(_score_mod(_mod_tanh), _score_mod_formula(_mod_tanh_plain), ODD),
    "score_mod_square": Case(_score_mod(_mod_square), _score_mod_formula(_mod_square), MHA),
    "score_mod_where_sigmoid": Case(_score_mod(_mod_where), _score_mod_formula(_mod_where_plain), DV),
    "score_mod_extra_weight": Case(_mod_weight, _mod_weight_formula, GQA, _head_weight),
    # softmax with a learned sink
    "sink": Case(_sink, _sink_formula, GQA, _sinks, ("q", "k", "v", "sink")),
    "sink_empty_rows": Case(_sink_empty_rows, _sink_empty_rows_formula, MHA, _sinks, ("q", "k", "v", "sink")),
}


def case_args(case: Case, dtype: torch.dtype, seed: int = 0) -> tuple:
    """q, k, v in `dtype` and the case's extras (float32 or integer)."""
    return (*qkv(case.shape, dtype, seed), *case.extras(case.shape, torch.Generator().manual_seed(seed + 100)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", CASES)
def test_block_gradients(name, dtype, backend):
    case = CASES[name]
    result = compute(case.variant, case.formula, case_args(case, dtype), set(case.grads), backend)
    check(result, set(case.grads), dtype, f"{name} {tuple(case.shape)} {dtype} on {backend}")


# --------------------------------------------------------------------------- named variants

DIFFERENTIABLE_EXTRAS = {"qwen3": ("q_norm_weight", "k_norm_weight"), "gpt_oss": ("sinks",)}


def _named(name: str):
    variant = getattr(variants, name)
    return variant, functools.partial(variant_formula, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_named_variant_gradients(name, dtype, backend):
    variant, formula = _named(name)
    wants = {"q", "k", "v", *DIFFERENTIABLE_EXTRAS.get(name, ())}
    result = compute(variant, formula, variant_inputs(name, dtype=dtype), wants, backend)
    check(result, wants, dtype, f"{name} {dtype} on {backend}")


@pytest.mark.parametrize(
    "name, wants",
    [
        ("qwen3", {"q"}),
        ("qwen3", {"k"}),
        ("qwen3", {"v"}),
        ("qwen3", {"q_norm_weight"}),
        ("qwen3", {"k", "k_norm_weight"}),
        ("gpt_oss", {"sinks"}),
        ("gpt_oss", {"q", "sinks"}),
        ("packed_documents", {"k", "v"}),
    ],
    ids=lambda x: x if isinstance(x, str) else "+".join(sorted(x)),
)
def test_only_inputs_that_require_grad_get_gradients(name, wants, backend):
    variant, formula = _named(name)
    result = compute(variant, formula, variant_inputs(name), wants, backend)
    check(result, wants, torch.float32, f"{name} requiring grad only for {sorted(wants)} on {backend}")


def test_nothing_requires_grad_gives_no_graph(backend):
    args = variant_inputs("qwen3")
    with af.backend(backend):
        out = variants.qwen3(*args)
        assert out.grad_fn is None and not out.requires_grad
        q = args[0].clone().requires_grad_()
        with torch.no_grad():
            out = variants.qwen3(q, *args[1:])
    assert out.grad_fn is None and not out.requires_grad


# --------------------------------------------------------------------------- gradients that are refused


@pytest.mark.parametrize(
    "variant, args, name",
    [
        (variants.bloom, lambda: variant_inputs("bloom"), "slopes"),
        (
            CASES["score_mod_extra_weight"].variant,
            lambda: case_args(CASES["score_mod_extra_weight"], torch.float32),
            "head_weight",
        ),
        (CASES["bias_custom_table"].variant, lambda: case_args(CASES["bias_custom_table"], torch.float32), "table"),
    ],
    ids=["alibi_slopes", "score_mod_extra", "custom_bias_extra"],
)
def test_gradient_of_a_constant_extra_is_an_error(variant, args, name):
    """ALiBi slopes and tensors read inside custom regions get no gradient: asking for one is an
    AttnFuseError naming the argument, never a silently missing gradient. (The reference backend
    differentiates them by plain autograd, so this is checked on the interpreter only.)"""
    leaves = list(args())
    index = variant.arg_names.index(name)
    leaves[index] = leaves[index].clone().requires_grad_()
    leaves[0] = leaves[0].clone().requires_grad_()
    with pytest.raises(af.AttnFuseError, match=name):
        with af.backend("interpret"):
            out = variant(*leaves)
        out.sum().backward()


def test_gradient_of_explicit_inv_freq_is_exact_or_refused(backend):
    """RoPE's explicit inv_freq tensor: a gradient that matches float64 autograd, or an
    AttnFuseError naming it; never a missing or wrong gradient."""
    case = CASES["rope_inv_freq"]
    wants = {"q", "k", "v", "freqs"}
    try:
        result = compute(case.variant, case.formula, case_args(case, torch.float32), wants, backend)
    except af.AttnFuseError as e:
        assert "freqs" in str(e)
        return
    check(result, wants, torch.float32, f"rope_inv_freq with freqs requiring grad on {backend}")


def test_alibi_slopes_formula_matches_hand_written():
    """The plain ALiBi helper against the formula of test_variants (an oracle check)."""
    slopes = af.alibi_slopes(4)
    qp, kp = plain.positions(5, 9)
    want = slopes.double()[None, :, None, None] * (kp[None, :] - qp[:, None])
    torch.testing.assert_close(plain.alibi_bias(slopes, 5, 9), want)
    assert math.isclose(plain.softcap(torch.tensor(100.0, dtype=F64), 2.0).item(), 2.0, rel_tol=1e-12)


def test_double_backward_is_an_error():
    """Gradients of gradients are not supported: a clear AttnFuseError, not a wrong or missing
    second derivative (issue 11)."""
    q, k, v = qkv(MHA, torch.float32)
    q.requires_grad_()
    with pytest.raises(af.AttnFuseError):
        with af.backend("interpret"):
            out = CASES["plain"].variant(q, k, v)
        (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        dq.sum().backward()
