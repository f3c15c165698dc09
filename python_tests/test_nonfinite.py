"""NaN and Inf in the inputs (issue 20, reliability).

- A NaN in V at a key the mask removes (garbage in an unused cache slot, past a document's
  end) must not reach the rows that do not keep that key: once, 0 * NaN turned whole rows
  into NaN. The rows that keep it still get NaN.
- With a NaN in q, an Inf in k or a NaN in V, the generated backward's NaN pattern agrees
  with the reference executor's (autograd), which once it did not (dk: 256 NaN against 106):
  P is exactly 0 at a masked score, in the reference and the kernels alike, and dS is 0
  there whatever dP holds. The one difference allowed: dense autograd's 0 * NaN in the
  bad entry's channel at the pairs a kernel's skipped blocks never form.

The generated kernels run under the interpreter on CPU, in fp32.
"""

from __future__ import annotations

import pytest
import torch

import attnfuse as af

N, D = 40, 16

# numpy (under the interpreter) says so when it multiplies an Inf by 0: that is the input here.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@af.variant
def causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def window(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.sliding_window(8))), v)


VARIANTS = {"causal": causal, "window": window}


def inputs(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, N, D, generator=gen) for _ in range(4)]


@pytest.mark.parametrize("backend", ["reference", "interpret"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_nan_in_v_at_a_masked_key_stays_out(name: str, backend: str) -> None:
    variant = VARIANTS[name]
    q, k, v, _ = inputs()
    poisoned = N - 3  # causal: kept only by the last 3 rows; window 8: by rows N-3 .. N-1
    bad = v.clone()
    bad[:, :, poisoned, 5] = float("nan")
    bad[:, :, poisoned, 9] = float("inf")
    with af.backend("reference"):
        clean = variant(q, k, v)
    with af.backend(backend):
        out = variant(q, k, bad)
    rows_keeping = torch.arange(N) >= poisoned
    assert torch.isfinite(out[:, :, ~rows_keeping]).all(), "a row that masks the key read its NaN"
    torch.testing.assert_close(out[:, :, ~rows_keeping], clean[:, :, ~rows_keeping], rtol=1e-5, atol=1e-5)
    # The rows that keep the key see its non-finite values, in those channels only.
    assert torch.isnan(out[:, :, rows_keeping, 5]).all()
    assert not torch.isfinite(out[:, :, rows_keeping, 9]).any()
    others = [c for c in range(D) if c not in (5, 9)]
    assert torch.isfinite(out[:, :, rows_keeping][..., others]).all()


def grads(variant, backend: str, q, k, v, g) -> list[torch.Tensor]:
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    with af.backend(backend):
        out = variant(q, k, v)
    out.backward(g)
    assert q.grad is not None and k.grad is not None and v.grad is not None
    return [out.detach(), q.grad, k.grad, v.grad]


BAD = {  # where the non-finite entry goes: (operand, row, channel)
    "nan_q": ("q", 11, 3),
    "inf_k": ("k", 17, 2),
    "nan_v": ("v", 23, 4),
}
DENSE_ARTIFACT = {"nan_q": "dk", "inf_k": "dq"}
"""The gradient in which the reference (dense autograd) has extra NaN: the other operand's
gradient in the bad entry's channel, 0 * NaN at the pairs the mask removes. A kernel never
forms the pairs of the blocks it skips, so it has them only in the blocks it visits."""


@pytest.mark.parametrize("where", list(BAD))
@pytest.mark.parametrize("name", list(VARIANTS))
def test_nonfinite_gradients_agree_with_the_reference(name: str, where: str) -> None:
    """The same NaN as the reference, except the reference's dense 0 * NaN products in one
    channel of one gradient; every other entry finite in both and equal."""
    variant = VARIANTS[name]
    q, k, v, g = inputs(1)
    operand, row, channel = BAD[where]
    {"q": q, "k": k, "v": v}[operand][:, :, row, channel] = float("inf") if operand == "k" else float("nan")
    ref = grads(variant, "reference", q, k, v, g)
    got = grads(variant, "interpret", q, k, v, g)
    for label, r, x in zip(["out", "dq", "dk", "dv"], ref, got, strict=True):
        r_nan, x_nan = torch.isnan(r), torch.isnan(x)
        if DENSE_ARTIFACT.get(where) == label:
            assert not (x_nan & ~r_nan).any(), f"{label}: NaN where the reference has none"
            extra = r_nan & ~x_nan
            assert not extra[..., [c for c in range(D) if c != channel]].any(), (
                f"{label}: the reference's extra NaN reach beyond channel {channel}"
            )
        else:
            assert torch.equal(r_nan, x_nan), (
                f"{label}: NaN at {int(x_nan.sum())} entries, the reference at {int(r_nan.sum())}"
            )
        finite = torch.isfinite(r) & torch.isfinite(x)
        torch.testing.assert_close(x[finite], r[finite], rtol=1e-4, atol=1e-4)
