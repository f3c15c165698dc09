"""Explicit RoPE positions, `af.rope(x, positions=pos)` (issue 12, item 1).

`pos` is an integer tensor [B, N] or [N] giving the position of each of x's N rows (for q
its Nq rows, for k its Nk rows); without it, kv row j has position j and query row i
position Nk - Nq + i. Positions change only the rotation: masks keep the row indices.

Every case is checked against an independent float64 formula (`plain_attention.rope_at`,
one batch entry at a time) and, for gradients, against float64 autograd through that formula
and through the reference executor (`test_grad.compute` / `check`), on

- `reference`: the eager executor, differentiated by plain autograd;
- `interpret`: the generated forward and backward Triton kernels under the interpreter (CPU,
  N <= 48). None of these is skipped: a lowering or a backend that refuses a rope at explicit
  positions fails them.

Position layouts: a left-padded batch (each batch entry's real tokens start at another
offset, its padding at negative positions), a packed batch (positions restart at 0 at each
document), one [N] row shared by the batch (a context-parallel shard's offset), arbitrary
non-monotone positions, and queries that are the last Nq of Nk tokens (a decode chunk).
The errors: a float, bool, rank-0/3 or constant `positions`, and an N or B that does not
match the tensor it rotates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import plain_attention as plain
import pytest
import torch
from test_grad import TOLERANCE, check, compute, rel_l2

import attnfuse as af
from attnfuse.reference import run_reference

F64 = torch.float64
DTYPES = [torch.float32, torch.float16]
DTYPE_IDS = ["fp32", "fp16"]
REFERENCE_TOLERANCE = 1e-5
"""Relative L2 error of the reference backend (float32 compute) against the float64 formula."""
FORMULA_AGREEMENT = 1e-12
"""Relative L2 distance allowed between the reference executor in float64 and the formula."""

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """A private kernel cache folder for this module's interpreted kernels."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("positions-cache")))
        yield


# --------------------------------------------------------------------------- shapes, positions, variants


class Shape(NamedTuple):
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int


SELF = Shape(3, 4, 2, 40, 40, 32)  # GQA 2:1, Nq == Nk (prefill of a batch)
CHUNK = Shape(3, 2, 1, 12, 40, 32)  # the last 12 of 40 tokens (a decode chunk against a cache)
SMALL = Shape(2, 2, 1, 33, 33, 16)  # N not a multiple of 16, for the interpreter


def qkv(shape: Shape, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, nq, nk, d = shape
    q = torch.randn(b, hq, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, hkv, nk, d, generator=gen).to(dtype)
    v = torch.randn(b, hkv, nk, d, generator=gen).to(dtype)
    return q, k, v


def _left_padded(shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry b has 0, 5, 17, ... padding tokens first; queries are the last Nq tokens."""
    pads = [(0, 5, 17, 3)[i] for i in range(shape.b)]
    kpos = plain.left_padded_positions(shape.nk, pads)
    return kpos[:, shape.nk - shape.nq :], kpos


def _packed(shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Documents packed back to back, positions restarting at 0 in each."""
    n = shape.nk
    rows = [[n], [n // 3, n - n // 3], [7, 9, n - 16], [1, n - 1]][: shape.b]
    kpos = plain.packed_positions(rows)
    return kpos[:, n - shape.nq :], kpos


def _shard(shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """One [N] row shared by the batch: a shard starting at position 1000."""
    kpos = torch.arange(shape.nk) + 1000
    return kpos[shape.nk - shape.nq :], kpos


def _arbitrary(shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent random positions in [-50, 5000) for q and k, [B, N], int32."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(-50, 5000, (shape.b, shape.nq), generator=gen, dtype=torch.int32)
    k = torch.randint(-50, 5000, (shape.b, shape.nk), generator=gen, dtype=torch.int32)
    return q, k


LAYOUTS: dict[str, Callable[[Shape], tuple[torch.Tensor, torch.Tensor]]] = {
    "left_padded": _left_padded,
    "packed": _packed,
    "shard_1d": _shard,
    "arbitrary": _arbitrary,
}
"""(q positions, k positions) for a shape."""
SHIFTS = ("left_padded", "shard_1d")
"""Layouts that shift q's and k's positions of a batch entry alike: as RoPE scores depend only
on q_pos - k_pos, their attention is the default one, and the q-only variant
(`test_absolute_positions`) is what shows that every position is read."""


@dataclass(frozen=True)
class Rope:
    """af.rope's keyword arguments, and the plain formula's (inv_freq, magnitude) for head dim d."""

    kwargs: dict
    style: str
    inv: Callable[[int], tuple[torch.Tensor, float]]


_LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 64}

ROPES = {
    "half": Rope({"theta": 10000.0}, "half", lambda d: (plain.default_inv_freq(10000.0, d), 1.0)),
    "interleaved": Rope(
        {"theta": 500.0, "style": "interleaved"}, "interleaved", lambda d: (plain.default_inv_freq(500.0, d), 1.0)
    ),
    "half_partial": Rope(
        {"theta": 1000.0, "rotary_dim": 8}, "half", lambda d: (plain.default_inv_freq(1000.0, 8), 1.0)
    ),
    "interleaved_partial": Rope(
        {"theta": 100.0, "style": "interleaved", "rotary_dim": 16},
        "interleaved",
        lambda d: (plain.default_inv_freq(100.0, 16), 1.0),
    ),
    "llama3": Rope(
        {"theta": 10000.0, "scaling": _LLAMA3},
        "half",
        lambda d: (plain.llama3_inv_freq(10000.0, d, 4.0, original=64), 1.0),
    ),
}


@functools.cache
def positioned(rope: str) -> af.Variant:
    """RoPE (q and k at their own positions) + causal attention."""
    kw = ROPES[rope].kwargs

    def roped_at(q, k, v, qpos, kpos):
        s = af.qk(af.rope(q, positions=qpos, **kw), af.rope(k, positions=kpos, **kw))
        return af.pv(af.softmax(af.mask(s, af.causal)), v)

    roped_at.__name__ = f"rope_{rope}_at"
    return af.variant(roped_at)


@functools.cache
def unpositioned(rope: str) -> af.Variant:
    """The same variant with the default positions."""
    kw = ROPES[rope].kwargs

    def roped(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(af.rope(q, **kw), af.rope(k, **kw)), af.causal)), v)

    roped.__name__ = f"rope_{rope}"
    return af.variant(roped)


def formula(rope: str) -> Callable[..., torch.Tensor]:
    """The float64 formula of `positioned(rope)`: the causal mask on row indices."""
    r = ROPES[rope]

    def run(q, k, v, qpos, kpos):
        inv, magnitude = r.inv(q.shape[-1])
        rq = plain.rope_at(q, qpos, inv, r.style, magnitude)
        rk = plain.rope_at(k, kpos, inv, r.style, magnitude)
        return plain.finish(plain.scores(rq, rk), v, plain.causal_keep(q.shape[2], k.shape[2]))

    return run


def args_of(shape: Shape, layout: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return (*qkv(shape, dtype), *LAYOUTS[layout](shape))


def run(variant: af.Variant, backend: str, *args: object) -> torch.Tensor:
    with af.backend(backend):
        return variant(*args)


# --------------------------------------------------------------------------- the plain formula itself


def test_layouts_are_what_they_say():
    qp, kp = _left_padded(Shape(3, 1, 1, 4, 8, 2))
    assert kp.tolist() == [list(range(8)), list(range(-5, 3)), list(range(-17, -9))]
    assert torch.equal(qp, kp[:, 4:])
    _, kp = _packed(Shape(3, 1, 1, 20, 20, 2))
    assert kp[1].tolist() == [*range(6), *range(14)]
    assert kp[2].tolist() == [*range(7), *range(9), *range(4)]


def test_rope_at_matches_rope_per_batch_entry():
    """plain.rope_at with [B, N] rotates entry b by row b; with [N] it is plain.rope."""
    x = torch.randn(2, 3, 5, 8, dtype=F64)
    inv = plain.default_inv_freq(100.0, 8)
    pos = torch.tensor([[0, 1, 2, 3, 4], [-2, 7, 7, 0, 100]])
    out = plain.rope_at(x, pos, inv)
    for b in range(2):
        assert torch.equal(out[b : b + 1], plain.rope(x[b : b + 1], pos[b], inv))
    assert torch.equal(plain.rope_at(x, pos[1], inv, "interleaved"), plain.rope(x, pos[1], inv, "interleaved"))


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rope", ROPES)
@pytest.mark.parametrize("shape", [SELF, CHUNK], ids=["self", "chunk"])
def test_reference_forward_matches_formula(shape, rope, layout):
    """The reference executor in float64 is the formula (to 1e-12); the reference backend
    (float32) within 1e-5."""
    args = args_of(shape, layout, torch.float32)
    want = formula(rope)(*args)
    exact = run_reference(positioned(rope).ir_module(*args), *args, compute_dtype=F64)
    assert rel_l2(exact, want) <= FORMULA_AGREEMENT
    out = run(positioned(rope), "reference", *args)
    assert out.dtype == torch.float32 and out.shape == want.shape
    assert rel_l2(out, want) <= REFERENCE_TOLERANCE
    if layout in SHIFTS:  # RoPE scores see q_pos - k_pos only: a shift per entry changes nothing
        assert rel_l2(formula(rope)(*args[:3], *plain.positions(shape.nq, shape.nk)), want) <= 1e-9
    else:  # the positions matter: the default ones give another result
        assert rel_l2(formula(rope)(*args[:3], *plain.positions(shape.nq, shape.nk)), want) > 1e-3


@pytest.mark.parametrize(
    ("rope", "layout"),
    [
        ("half", "left_padded"),
        ("half", "packed"),
        ("half", "shard_1d"),
        ("interleaved_partial", "arbitrary"),
        ("half_partial", "left_padded"),
        ("llama3", "packed"),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_interpret_forward_matches_formula(rope, layout, dtype):
    args = args_of(SMALL, layout, dtype)
    want = formula(rope)(*args)
    out = run(positioned(rope), "interpret", *args)
    assert out.dtype == dtype and out.shape == want.shape
    err = rel_l2(out, want)
    assert err <= TOLERANCE[dtype], f"{rope} at {layout} positions, {dtype}: rel-L2 {err:.2e}"


def test_interpret_decode_chunk_matches_formula():
    """Queries at the end of a left-padded cache, Nq != Nk, q and k positions [B, Nq] and [B, Nk]."""
    shape = Shape(2, 4, 2, 5, 48, 16)
    args = args_of(shape, "left_padded", torch.float32)
    err = rel_l2(run(positioned("half"), "interpret", *args), formula("half")(*args))
    assert err <= TOLERANCE[torch.float32]


@af.variant
def _q_only(q, k, v, pos):
    """Only q rotated (at `pos`), so that the output depends on absolute positions."""
    return af.pv(af.softmax(af.qk(af.rope(q, theta=100.0, style="interleaved", positions=pos), k)), v)


def _q_only_formula(q, k, v, pos):
    return plain.finish(
        plain.scores(plain.rope_at(q, pos, plain.default_inv_freq(100.0, q.shape[-1]), "interleaved"), k), v
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_absolute_positions(backend, layout):
    """A rope on q alone at explicit positions ([B, Nq] or [Nq]) against the formula, and not
    the default rotation."""
    shape = CHUNK if backend == "reference" else SMALL
    q, k, v, qpos, _ = args_of(shape, layout, torch.float32)
    want = _q_only_formula(q, k, v, qpos)
    assert rel_l2(run(_q_only, backend, q, k, v, qpos), want) <= TOLERANCE[torch.float32] / 10
    assert rel_l2(_q_only_formula(q, k, v, plain.positions(shape.nq, shape.nk)[0]), want) > 1e-2


@pytest.mark.parametrize("kind", ["expanded", "transposed"])
def test_positions_tensors_that_are_views(kind):
    """[B, N] positions that are strided views: one row expanded over the batch (stride 0, as
    transformers' `position_ids.expand(B, -1)`) and the transpose of an [N, B] tensor. The
    launcher's per-call cos/sin tables read them through their strides (interpreted kernels
    against the formula)."""
    q, k, v, row, _ = args_of(SMALL, "shard_1d", torch.float32)
    if kind == "expanded":
        pos = row.expand(SMALL.b, -1)
    else:
        pos = (row[:, None] + 300 * torch.arange(SMALL.b)[None, :]).t()
    assert not pos.is_contiguous() and pos.shape == (SMALL.b, SMALL.nq)
    want = _q_only_formula(q, k, v, pos)
    assert rel_l2(run(_q_only, "interpret", q, k, v, pos), want) <= TOLERANCE[torch.float32] / 10


# --------------------------------------------------------------------------- the default convention


def _default_positions(shape: Shape, batched: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    qp, kp = (p.to(dtype) for p in plain.positions(shape.nq, shape.nk))
    if batched:
        qp, kp = qp.expand(shape.b, -1).contiguous(), kp.expand(shape.b, -1).contiguous()
    return qp, kp


DEFAULT_CASES = [
    (SELF, True, torch.int64),
    (CHUNK, False, torch.int32),
    (Shape(2, 4, 2, 1, 37, 16), True, torch.int32),  # one query
]


@pytest.mark.parametrize(("shape", "batched", "pos_dtype"), DEFAULT_CASES, ids=["self_2d", "chunk_1d", "decode"])
@pytest.mark.parametrize("rope", ["half", "interleaved_partial", "llama3"])
def test_default_positions_reproduce_the_default_exactly(shape, batched, pos_dtype, rope):
    """Positions Nk - Nq + i for q and j for k, given explicitly, give bit for bit the
    output and the q, k, v gradients of the variant without positions (reference backend)."""
    q, k, v = qkv(shape, torch.float32)
    dout = torch.randn(shape.b, shape.hq, shape.nq, shape.d, generator=torch.Generator().manual_seed(1))
    results = []
    for variant, extra in ((unpositioned(rope), ()), (positioned(rope), _default_positions(shape, batched, pos_dtype))):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = run(variant, "reference", *leaves, *extra)
        out.backward(dout)
        results.append((out.detach(), *(x.grad for x in leaves)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results, strict=True):
        assert torch.equal(a, b), f"{name} differs: rel-L2 {rel_l2(a, b):.2e}"


def test_interpret_default_positions_reproduce_the_default():
    shape = Shape(2, 2, 1, 9, 33, 16)
    q, k, v = qkv(shape, torch.float32)
    plain_out = run(unpositioned("half"), "interpret", q, k, v)
    for batched in (True, False):
        out = run(positioned("half"), "interpret", q, k, v, *_default_positions(shape, batched, torch.int64))
        assert rel_l2(out, plain_out) <= 1e-5


# --------------------------------------------------------------------------- gradients


GRAD_CASES = [
    ("half", "left_padded", SELF),
    ("interleaved", "packed", SELF),
    ("half_partial", "shard_1d", CHUNK),
    ("interleaved_partial", "arbitrary", CHUNK),
    ("llama3", "left_padded", CHUNK),
]
WANTS = {"q", "k", "v"}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("rope", "layout", "shape"), GRAD_CASES, ids=[f"{r}-{lay}" for r, lay, _ in GRAD_CASES])
def test_reference_gradients(rope, layout, shape, dtype):
    """dq, dk, dv of the reference backend against float64 autograd of the formula and of the
    reference executor (the positions are integers: no gradient)."""
    result = compute(positioned(rope), formula(rope), args_of(shape, layout, dtype), WANTS, "reference")
    check(result, WANTS, dtype, f"{rope} at {layout} positions {tuple(shape)} {dtype} on reference")


INTERPRET_GRAD_CASES = [
    ("half", "left_padded"),
    ("interleaved_partial", "packed"),
    ("half_partial", "shard_1d"),
    ("llama3", "arbitrary"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    ("rope", "layout"), INTERPRET_GRAD_CASES, ids=[f"{r}-{lay}" for r, lay in INTERPRET_GRAD_CASES]
)
def test_interpret_gradients(rope, layout, dtype):
    result = compute(positioned(rope), formula(rope), args_of(SMALL, layout, dtype), WANTS, "interpret")
    check(result, WANTS, dtype, f"{rope} at {layout} positions {tuple(SMALL)} {dtype} on interpret")


def test_interpret_gradients_of_a_decode_chunk():
    shape = Shape(2, 2, 1, 7, 40, 16)
    result = compute(
        positioned("half"), formula("half"), args_of(shape, "left_padded", torch.float32), WANTS, "interpret"
    )
    check(result, WANTS, torch.float32, f"half at left-padded positions {tuple(shape)} on interpret")


# --------------------------------------------------------------------------- one tensor for q and k; other blocks


@af.variant
def _shared(q, k, v, pos):
    """q and k at the same positions (self-attention, Nq == Nk), with QK-norm and a window."""
    q = af.rope(af.qk_norm(q), theta=500.0, positions=pos)
    k = af.rope(af.qk_norm(k), theta=500.0, positions=pos)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.sliding_window(9))), v)


def _shared_formula(q, k, v, pos):
    inv = plain.default_inv_freq(500.0, q.shape[-1])
    rq, rk = plain.rope_at(plain.rms_norm(q), pos, inv), plain.rope_at(plain.rms_norm(k), pos, inv)
    return plain.finish(plain.scores(rq, rk), v, plain.sliding_window_keep(q.shape[2], k.shape[2], 9))


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_one_positions_tensor_for_q_and_k(backend):
    """The masks keep the row indices (a sliding window over rows, not over positions)."""
    args = args_of(SMALL, "packed", torch.float32)[:4]
    result = compute(_shared, _shared_formula, args, WANTS, backend)
    check(result, WANTS, torch.float32, f"shared positions on {backend}")


# --------------------------------------------------------------------------- the traced IR


def test_traced_ir_passes_positions_as_the_rope_operand():
    q, k, v, qp, kp = args_of(CHUNK, "left_padded", torch.float16)
    text = positioned("half").ir(q, k, v, qp, kp.to(torch.int32))
    assert "attn.rope %q half theta = 10000.0 rotary_dim = 32 positions(%qpos : tensor<?x?xi64>)" in text
    assert "attn.rope %k half theta = 10000.0 rotary_dim = 32 positions(%kpos : tensor<?x?xi32>)" in text
    text = positioned("llama3").ir(q, k, v, qp[0], kp[0])
    assert "positions(%qpos : tensor<?xi64>) : tensor<?x2x?x32xf16>" in text
    assert "#attn.rope_scaling<llama3" in text


def test_positions_after_other_pre_matmul_blocks_take_their_tensor_length():
    """Through af.qk_norm / af.scale, q's positions are [B, Nq], k's [B, Nk]."""

    @af.variant
    def deep(q, k, v, qpos, kpos):
        q = af.rope(af.scale(af.qk_norm(q), 2.0), positions=qpos)
        k = af.rope(af.qk_norm(k), positions=kpos)
        return af.pv(af.softmax(af.qk(q, k)), v)

    q, k, v, qp, kp = args_of(CHUNK, "packed", torch.float32)
    deep(q, k, v, qp, kp)
    with pytest.raises(af.AttnFuseError, match=r"qpos must have size 12 \(the query length\) in dim 1"):
        deep(q, k, v, kp, kp)
    with pytest.raises(af.AttnFuseError, match=r"kpos must have size 40 \(the kv length\) in dim 1"):
        deep(q, k, v, qp, qp)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("pos", "got"),
    [
        (torch.arange(40, dtype=torch.float32), "a 1-d torch.float32 tensor"),
        (torch.zeros(3, 40, dtype=torch.bfloat16), "a 2-d torch.bfloat16 tensor"),
        (torch.ones(40, dtype=torch.bool), "a 1-d torch.bool tensor"),
        (torch.zeros(3, 1, 40, dtype=torch.int64), "a 3-d torch.int64 tensor"),
        (torch.tensor(4), "a 0-d torch.int64 tensor"),
    ],
    ids=["float", "bf16", "bool", "rank3", "rank0"],
)
def test_positions_must_be_an_integer_tensor_of_rank_1_or_2(pos, got):
    q, k, v = qkv(SELF, torch.float32)
    with pytest.raises(af.AttnFuseError) as e:
        _q_only(q, k, v, pos)
    message = str(e.value)
    assert "af.rope positions (pos) must be an integer tensor [B, N] or [N] (torch.int32 or torch.int64)" in message
    assert got in message


def test_positions_must_be_an_argument_of_the_variant():
    q, k, v = qkv(SELF, torch.float32)
    with pytest.raises(af.AttnFuseError, match=r"af.rope positions must be a tensor argument of the variant, got"):
        _q_only(q, k, v, 7)  # a constant argument
    captured = torch.arange(40)

    @af.variant
    def capturing(q, k, v):
        return af.pv(af.softmax(af.qk(af.rope(q, positions=captured), k)), v)

    with pytest.raises(af.AttnFuseError, match="not a tensor captured from outside"):
        capturing(q, k, v)

    @af.variant
    def listed(q, k, v):
        return af.pv(af.softmax(af.qk(af.rope(q, positions=list(range(40))), k)), v)

    with pytest.raises(af.AttnFuseError, match="must be a tensor argument of the variant, got"):
        listed(q, k, v)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_positions_must_match_the_length_and_batch(backend):
    """Checked before anything runs, on every backend, on the slow and the hot path alike."""
    q, k, v, qp, kp = args_of(CHUNK, "left_padded", torch.float32)
    variant = positioned("half")
    cases = [
        ((qp[:, 1:], kp), r"qpos must have size 12 \(the query length\) in dim 1 \(af.rope positions of q: \[B, Nq\]"),
        ((qp, kp[:, :-1]), r"kpos must have size 40 \(the kv length\) in dim 1 \(af.rope positions of k: \[B, Nk\]"),
        ((qp, kp[:2]), r"kpos must have size 3 \(the batch size\) in dim 0"),
        ((qp, torch.cat([kp, kp])), r"kpos must have size 3 \(the batch size\) in dim 0"),
        ((qp[0], kp[0, 1:]), r"kpos must have size 40 \(the kv length\) in dim 0 \(af.rope positions of k: \[Nk\]"),
        ((kp, kp), r"qpos must have size 12 \(the query length\)"),
    ]
    for i in range(2):  # the second round runs through the hot path's entries
        for (qpos, kpos), message in cases:
            if i:
                run(variant, backend, q, k, v, *LAYOUTS["left_padded"](CHUNK))
                run(variant, backend, q, k, v, qp[0], kp[0])
            with pytest.raises(af.AttnFuseError, match=message):
                run(variant, backend, q, k, v, qpos, kpos)


def test_one_positions_tensor_for_q_and_k_needs_nq_equal_nk():
    q, k, v = qkv(CHUNK, torch.float32)
    pos = torch.arange(CHUNK.nk).expand(CHUNK.b, -1)
    with pytest.raises(af.AttnFuseError, match=r"pos must have size 12 \(the query length\)"):
        run(_shared, "reference", q, k, v, pos)


def test_reference_executor_checks_the_positions_shape():
    """run_reference on IR: the positions operand must be [B, N] or [N] of its rope's input."""
    q, k, v, qp, kp = args_of(CHUNK, "left_padded", torch.float32)
    module = positioned("half").ir_module(q, k, v, qp, kp)
    run_reference(module, q, k, v, qp, kp)
    with pytest.raises(af.AttnFuseError, match=r"attn.rope positions must have shape \[B, N\] = \[3, 12\]"):
        run_reference(module, q, k, v, kp, kp)
    with pytest.raises(af.AttnFuseError, match=r"attn.rope positions must have shape \[B, N\] = \[3, 40\]"):
        run_reference(module, q, k, v, qp, kp[:2])
    module = positioned("half").ir_module(q, k, v, qp[0], kp[0])
    with pytest.raises(af.AttnFuseError, match=r"attn.rope positions must have shape \[N\] = \[40\]"):
        run_reference(module, q, k, v, qp[0], kp[0, :5])
