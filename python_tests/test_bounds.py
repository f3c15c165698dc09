"""One behaviour on every backend where an index leaves its range (issue 10, item 4).

- `attn.extract` outside an extra tensor's bounds reads 0 (false for bool): the reference
  defines it so, and kernels mask such loads to the tensor's bounds.
- Integer division by zero in a region: x / 0 = x // 0 = 0 and x % 0 = x.
- `af.pv` with a v whose length is not k's: an `AttnFuseError` naming both lengths, on
  every backend and from the reference executor, before anything is launched.

Each case runs on the reference executor (against a plain formula written here) and
on the generated kernel under the interpreter (against the reference), in fp16/fp32.
"""

from __future__ import annotations

import pytest
import torch
from kernel_harness import check, qkv, variant

import attnfuse as af
from attnfuse.reference import run_reference

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")

F16, F32 = torch.float16, torch.float32


@pytest.fixture(scope="module")
def kdir(tmp_path_factory):
    return tmp_path_factory.mktemp("kernels")


def plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + bias) v in float64, bias broadcast to [B, H, Nq, Nk]."""
    s = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
    return torch.softmax(s, dim=-1) @ v.double()


# ----------------------------------------------------------------------------- attn.extract out of bounds

# bias = tab[h, kv + shift]: past the end for the last keys (shift 1) or before the start
# for the first (shift -1).
SHIFTED_BIAS = """attn.bias {s} custom(%tab : tensor<2x?xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<2x?xf32>):
    %c = arith.constant SHIFT : i32
    %j = arith.addi %ki, %c : i32
    %x = attn.extract %t[%h, %j] : tensor<2x?xf32>
    attn.yield %x : f32
  }"""


def shifted_bias(tab: torch.Tensor, nk: int, shift: int) -> torch.Tensor:
    """tab[h, kv + shift], 0 where kv + shift is outside [0, tab.shape[1])."""
    j = torch.arange(nk) + shift
    inside = (j >= 0) & (j < tab.shape[1])
    return torch.where(inside, tab[:, j.clamp(0, tab.shape[1] - 1)].double(), 0.0)[None, :, None, :]


@pytest.mark.parametrize("shift", [1, -1, 40], ids=["past_end", "before_start", "all_outside"])
@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_extract_out_of_bounds_reads_zero(kdir, shift, dtype):
    q, k, v = qkv(nq=24, nk=40, dtype=dtype)
    tab = torch.randn(2, 40)
    ir = variant(dtype=dtype, score_ops=[SHIFTED_BIAS.replace("SHIFT", str(shift))], extras=["%tab: tensor<2x?xf32>"])
    ref = run_reference(ir, q, k, v, tab)
    torch.testing.assert_close(ref, plain(q, k, v, shifted_bias(tab, 40, shift)), rtol=0, atol=1e-9)
    check(ir, [q, k, v, tab], kdir)


# A key-padding mask read one batch too far: lens[b + 1] is 0 for the last batch, whose
# rows then keep nothing (zeros); a scalar index, so a masked scalar load in the kernel.
NEXT_LENGTH_MASK = """attn.mask {s} custom(%lens : tensor<?xi32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %l: tensor<?xi32>):
    %one = arith.constant 1 : i32
    %nb = arith.addi %b, %one : i32
    %n = attn.extract %l[%nb] : tensor<?xi32>
    %keep = arith.cmpi slt, %ki, %n : i32
    attn.yield %keep : i1
  }"""


def test_scalar_extract_out_of_bounds_reads_zero(kdir):
    q, k, v = qkv(b=3, nq=16, nk=24)
    lens = torch.tensor([5, 24, 13], dtype=torch.int32)
    ir = variant(score_ops=[NEXT_LENGTH_MASK], extras=["%lens: tensor<?xi32>"])
    ref = run_reference(ir, q, k, v, lens)
    assert (ref[2] == 0).all()  # lens[3] is outside: 0 keys kept
    bias = torch.where(torch.arange(24) < torch.tensor([24, 13, 0])[:, None], 0.0, float("-inf"))
    torch.testing.assert_close(ref[:2], plain(q, k, v, bias[:, None, None, :])[:2], rtol=0, atol=1e-9)
    check(ir, [q, k, v, lens], kdir)


def test_bool_table_out_of_bounds_reads_false(kdir):
    """keep[q_idx, kv_idx + 2]: false past the table's end."""
    mask = """attn.mask {s} custom(%keep : tensor<?x?xi1>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<?x?xi1>):
    %c = arith.constant 2 : i32
    %j = arith.addi %ki, %c : i32
    %x = attn.extract %t[%qi, %j] : tensor<?x?xi1>
    attn.yield %x : i1
  }"""
    q, k, v = qkv(nq=20, nk=20)
    table = torch.rand(20, 20, generator=torch.Generator().manual_seed(3)) < 0.7
    ir = variant(score_ops=[mask], extras=["%keep: tensor<?x?xi1>"])
    ref = run_reference(ir, q, k, v, table)
    shifted = torch.zeros(20, 20, dtype=torch.bool)
    shifted[:, :18] = table[:, 2:]
    bias = torch.where(shifted, 0.0, float("-inf"))[None, None]
    expected = torch.nan_to_num(plain(q, k, v, bias), nan=0.0)  # rows keeping nothing give zeros
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-9)
    check(ir, [q, k, v, table], kdir)


# ----------------------------------------------------------------------------- division by zero

# score + (q // d) / 8 + (q / d) / 16 + (q % d) / 32 with d = kv % 4 - 1 in [-1, 2]
# (zero at kv = 1, 5, 9...); q the query's position, which is negative for no query here.
DIVISION_SCORE_MOD = """attn.score_mod {s} {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %c4 = arith.constant 4 : i32
    %c1 = arith.constant 1 : i32
    %r4 = arith.remsi %ki, %c4 : i32
    %d = arith.subi %r4, %c1 : i32
    %fd = arith.floordivsi %qi, %d : i32
    %td = arith.divsi %qi, %d : i32
    %rm = arith.remsi %qi, %d : i32
    %f1 = arith.sitofp %fd : i32 to f32
    %f2 = arith.sitofp %td : i32 to f32
    %f3 = arith.sitofp %rm : i32 to f32
    %e1 = arith.constant 0.125 : f32
    %e2 = arith.constant 0.0625 : f32
    %e3 = arith.constant 0.03125 : f32
    %g1 = arith.mulf %f1, %e1 : f32
    %g2 = arith.mulf %f2, %e2 : f32
    %g3 = arith.mulf %f3, %e3 : f32
    %s1 = arith.addf %x, %g1 : f32
    %s2 = arith.addf %s1, %g2 : f32
    %s3 = arith.addf %s2, %g3 : f32
    attn.yield %s3 : f32
  }"""


def division_bias(nq: int, nk: int) -> torch.Tensor:
    """The score_mod's addend, from Python's integers: x // 0 = x / 0 = 0, x % 0 = x."""
    bias = torch.zeros(nq, nk, dtype=torch.float64)
    for i in range(nq):
        x = nk - nq + i
        for j in range(nk):
            d = j % 4 - 1
            floor = x // d if d else 0
            trunc = int(x / d) if d else 0
            rem = x - trunc * d
            bias[i, j] = floor / 8 + trunc / 16 + rem / 32
    return bias[None, None]


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_integer_division_by_zero(kdir, dtype):
    q, k, v = qkv(nq=20, nk=36, dtype=dtype)
    ir = variant(dtype=dtype, score_ops=[DIVISION_SCORE_MOD])
    ref = run_reference(ir, q, k, v)
    torch.testing.assert_close(ref, plain(q, k, v, division_bias(20, 36)), rtol=0, atol=1e-9)
    check(ir, [q, k, v], kdir)


# ----------------------------------------------------------------------------- through the Python API


@af.variant
def next_key_bias(q, k, v, tab):
    s = af.qk(q, k)
    s = af.bias(s, lambda b, h, q_idx, kv_idx: tab[h, kv_idx + 1])
    return af.pv(af.softmax(s), v)


@af.variant
def modulo_by_zero(q, k, v):
    s = af.qk(q, k)
    s = af.score_mod(
        s, lambda x, b, h, q_idx, kv_idx: x + (q_idx // (kv_idx % 3)) * 0.1 + (q_idx % (kv_idx % 3)) * 0.01
    )
    return af.pv(af.softmax(s), v)


def test_backends_agree_through_the_api():
    """A table read one key too far, and // and % by zero, in variants from the DSL."""
    q, k, v = qkv(nq=16, nk=32, dtype=F32)
    tab = torch.randn(2, 32)
    x = torch.arange(16, 32)[:, None]
    m = torch.arange(32)[None, :] % 3
    mod_bias = torch.where(m == 0, 0, x // m.clamp(min=1)) * 0.1 + torch.where(m == 0, x, x % m.clamp(min=1)) * 0.01
    cases = [
        (next_key_bias, (q, k, v, tab), shifted_bias(tab, 32, 1)),
        (modulo_by_zero, (q, k, v), mod_bias.double()[None, None]),
    ]
    for fn, args, bias in cases:
        expected = plain(q, k, v, bias)
        for backend in ("reference", "interpret"):
            with af.backend(backend):
                out = fn(*args)
            torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-4, msg=f"{fn.__name__} {backend}")


# ----------------------------------------------------------------------------- af.pv's v length


@af.variant
def values_from_q(q, k, v):
    """af.pv reads q as v: q must then have k's length."""
    return af.pv(af.softmax(af.qk(q, k)), q)


@af.variant
def keys_from_q(q, k, v):
    """af.qk reads q as k: v must then have q's length."""
    return af.pv(af.softmax(af.qk(k, q)), v)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_pv_with_v_shorter_than_keys_is_an_error(backend):
    q, k, v = qkv(nq=16, nk=16, dtype=F32)
    with af.backend(backend):
        assert values_from_q(q, k, v).shape == (1, 2, 16, 32)  # one length: fine (and cached)
        # The same length bucket: the hot path must not reuse the entry.
        with pytest.raises(af.AttnFuseError, match=r"af.pv's v \(q\) has 12 positions .* af.qk's k \(k\) has 16"):
            values_from_q(q[:, :, :12], k, v)
        with pytest.raises(af.AttnFuseError, match=r"af.pv's v \(v\) has 16 positions .* af.qk's k \(q\) has 12"):
            keys_from_q(q[:, :, :12], k, v)
        kernel = values_from_q.compile(q, k, v)
        with pytest.raises(af.AttnFuseError, match=r"has 12 positions .* has 16"):
            kernel(q[:, :, :12], k, v)
        with pytest.raises(af.AttnFuseError, match=r"has 12 positions .* has 16"):
            values_from_q.compile(q[:, :, :12], k, v)


def test_reference_executor_names_both_lengths():
    q, k, v = qkv(nq=12, nk=16)
    ir = values_from_q.ir(q, k[:, :, :12], v[:, :, :12])  # traced where the lengths agree
    with pytest.raises(af.AttnFuseError, match=r"attn.pv: v has 12 rows .* k has 16 rows"):
        run_reference(ir, q, k, v)
