"""The sm90 Gluon backward (`attnfuse/targets/triton/gluon_bwd_sm90.py`) without a GPU: generated
backward modules launch its dK/dV and dQ kernels with the variant's functions, and both compile
for sm 90 (Triton's own compiler and ptxas, no driver) within Hopper's shared memory, with
asynchronous wgmma, TMA loads and per-partition register budgets; dQ by TMA reduce-adds (the
default) or by the ordered dQ kernel. Its per-call check accepts exactly the calls it covers. Its
gradients are test_gpu_gluon_bwd.py's (on the H200)."""

from __future__ import annotations

import re

import pytest
import torch
from kernel_harness import CUSTOM_MASK, compile_for_sm90, variant

from attnfuse.cache_loader import interpreter_library, load_module
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.targets.triton import gluon_bwd_launch
from attnfuse.targets.triton.printer import GLUON_BWD_FILES, gluon_source

HOPPER_SMEM = 227 * 1024
ROPE = "attn.rope {x} half theta = 10000.0 rotary_dim = %d"
NORM = "attn.norm {x} eps = 1.0e-06 weight(%w{W} : tensor<%dxf32>)"


class _Capture:
    """Stands in for a Gluon kernel: records the arguments of `kernel[grid](...)` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid: tuple):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


# name -> (dtype, head dim, q/k ops, score ops, softmax, extras, dq-reduce: True as by default, False ordered)
CASES = {
    "qknorm-rope-causal-d128-bf16": (
        torch.bfloat16,
        128,
        [NORM, ROPE],
        ["attn.mask {s} causal"],
        "",
        ["%wq: tensor<128xf32>", "%wk: tensor<128xf32>"],
        True,
    ),
    "softcap-window-d64-f16": (
        torch.float16,
        64,
        [],
        ["attn.softcap {s} cap = 50.0", "attn.mask {s} sliding_window(300)"],
        "",
        [],
        True,
    ),
    "alibi-causal-sink-d128-bf16": (
        torch.bfloat16,
        128,
        [],
        ["attn.bias {s} alibi(%sl : tensor<8xf32>)", "attn.mask {s} causal"],
        "sink(%sk : tensor<8xf32>)",
        ["%sl: tensor<8xf32>", "%sk: tensor<8xf32>"],
        True,
    ),
    "custom-mask-d64-bf16-ordered": (torch.bfloat16, 64, [], [CUSTOM_MASK], "", ["%t: tensor<?xi32>"], False),
    "rope-causal-d128-bf16-ordered": (torch.bfloat16, 128, [ROPE], ["attn.mask {s} causal"], "", [], False),
    "rope-causal-d64-f16-ordered": (torch.float16, 64, [ROPE], ["attn.mask {s} causal"], "", [], False),
}


def _capturing(source: str, tmp_path) -> tuple:
    """The generated backward module, its two Gluon kernels replaced by captures of their launches
    (and the real ones), taking the Gluon path without a GPU (the generic kernels do nothing; the
    names of those launched are in `module.launched`). A fresh import: `load_source` would hand
    another test's patched module back for the same text."""
    path = tmp_path / "captured_backward.py"
    path.write_text(source, encoding="utf-8")
    module = load_module(path, interpret=False, name=f"attnfuse_captured_{tmp_path.name}")
    kernels = {"attn_bwd_sm90": _Capture(), "attn_bwd_dq_sm90": _Capture()}
    real = {k: getattr(module, k) for k in kernels}
    for k, capture in kernels.items():
        setattr(module, k, capture)
    module._gluon_bwd_fits = lambda *args: True
    module.launched = []
    module._launch = lambda kernel, *args: module.launched.append(kernel.fn.__name__)  # no GPU here
    return module, kernels, real


@pytest.mark.parametrize("name", list(CASES))
def test_generated_backward_kernels_compile_for_sm90(name: str, tmp_path) -> None:
    dtype, d, chain, score_ops, softmax, extras, reduce = CASES[name]
    q_ops = [c.replace("%d", str(d)).replace("{W}", "q") for c in chain]
    k_ops = [c.replace("%d", str(d)).replace("{W}", "k") for c in chain]
    ir = variant(
        dtype=dtype, hq=8, hkv=2, d=d, q_ops=q_ops, k_ops=k_ops, score_ops=score_ops, softmax=softmax, extras=extras
    )
    source = compile_module(
        parse_module(ir), sm=90, seq_len=4096, direction="bwd", wrt=(0, 1, 2), gluon_dq_reduce=reduce
    ).source
    assert gluon_source(GLUON_BWD_FILES) in source
    module, kernels, real = _capturing(source, tmp_path)
    q = torch.zeros(1, 8, 256, d, dtype=dtype)
    k, v = torch.zeros(1, 2, 256, d, dtype=dtype), torch.zeros(1, 2, 256, d, dtype=dtype)
    values = {
        "%wq": torch.ones(d),
        "%wk": torch.ones(d),
        "%sl": torch.ones(8),
        "%sk": torch.zeros(8),
        "%t": torch.zeros(256, dtype=torch.int32),
    }
    args = [values[e.split(":")[0]] for e in extras]
    module.launch(q, k, v, *args, torch.zeros_like(q), torch.zeros(1, 8, 256), torch.zeros_like(q))
    ((dkdv_args, dkdv_kwargs),) = kernels["attn_bwd_sm90"].calls
    assert dkdv_kwargs["DQ"] is reduce and dkdv_kwargs["RANGE"] is module.gluon_bwd_range
    assert dkdv_kwargs["HOOK_MASKED"] is module.gluon_bwd_masked
    assert len(kernels["attn_bwd_dq_sm90"].calls) == (0 if reduce else 1)
    binary = compile_for_sm90(real["attn_bwd_sm90"], dkdv_args, dkdv_kwargs, num_warps=dkdv_kwargs["num_warps"])
    ptx = binary.asm["ptx"]
    assert 0 < binary.metadata.shared <= HOPPER_SMEM
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx
    assert ("cp.reduce.async.bulk.tensor" in ptx) is reduce  # dQ's shares by TMA reduce-add
    # K's RoPE alone: the kernel stores dK back through it, in dK's dtype (k_cos: argument 10);
    # at head dim 64 it also rotates the keys it reads (ROTATE_K: no rotate_k, which stays for
    # the generic kernels), and for the ordered dQ kernel stores them (k_rot_desc: argument 13,
    # a TMA store). With QK-norm, K pre-rotated and an fp32 dK for attn_bwd_dk_acc
    k_rope_alone = chain == [ROPE]
    rotates = k_rope_alone and d == 64
    assert (dkdv_args[10] is not None) is k_rope_alone
    assert dkdv_kwargs["ROTATE_K"] is rotates
    assert (dkdv_args[13] is not None) is (rotates and not reduce)
    assert ("rotate_k" in module.launched) is (bool(chain) and not rotates)
    assert ("def rotate_k" in source) is bool(chain)
    assert (dkdv_args[7].dtype == dtype) is (not chain or k_rope_alone)
    assert ("def attn_bwd_dk_acc" in source) is (bool(chain) and not k_rope_alone)
    assert bool(re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared", ptx)) is (rotates and not reduce)
    # Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (64 x 64 products) take K and V from registers at head dim 64
    # (every such product's first operand a register list), from shared memory at 128 (a descriptor)
    square = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\S*\s+\{[^}]*\},\s*(\{|%rd)", ptx))
    assert square == ({"{"} if d == 64 else {"%rd"})
    if not reduce:
        ((dq_args, dq_kwargs),) = kernels["attn_bwd_dq_sm90"].calls
        assert dq_kwargs["RANGE"] is module.gluon_bwd_kv_range
        binary = compile_for_sm90(real["attn_bwd_dq_sm90"], dq_args, dq_kwargs, num_warps=dq_kwargs["num_warps"])
        ptx = binary.asm["ptx"]
        assert 0 < binary.metadata.shared <= HOPPER_SMEM
        assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx
        assert "cp.reduce.async.bulk" not in ptx and "atom.global" not in ptx and "red.global" not in ptx  # ordered


def test_deterministic_algorithms_take_the_ordered_dq_kernel(tmp_path) -> None:
    """By default the dK/dV kernel adds dQ's shares up by TMA reduce-adds (not bitwise
    reproducible); a call under `torch.use_deterministic_algorithms(True)` takes the ordered dQ
    kernel after it instead, with the same module."""
    ir = variant(dtype=torch.float16, hq=4, hkv=2, d=64, score_ops=["attn.mask {s} causal"])
    source = compile_module(parse_module(ir), sm=90, seq_len=4096, direction="bwd", wrt=(0, 1, 2)).source
    module, kernels, _ = _capturing(source, tmp_path)
    q, out, dout = (torch.zeros(1, 4, 256, 64, dtype=torch.float16) for _ in range(3))
    k, v = torch.zeros(1, 2, 256, 64, dtype=torch.float16), torch.zeros(1, 2, 256, 64, dtype=torch.float16)
    module.launch(q, k, v, out, torch.zeros(1, 4, 256), dout)
    torch.use_deterministic_algorithms(True)
    try:
        module.launch(q, k, v, out, torch.zeros(1, 4, 256), dout)
    finally:
        torch.use_deterministic_algorithms(False)
    assert [kw["DQ"] for _, kw in kernels["attn_bwd_sm90"].calls] == [True, False]
    assert len(kernels["attn_bwd_dq_sm90"].calls) == 1  # the deterministic call's only


@pytest.mark.parametrize(
    "rope,reduce,d",
    [(False, False, 128), (True, False, 128), (True, True, 128), (True, False, 64)],
    ids=["causal", "rope-causal", "rope-causal-dq-reduce", "rope-causal-d64"],
)
def test_the_hugging_face_layout_is_read_and_written_in_place(rope: bool, reduce: bool, d: int, tmp_path) -> None:
    """q, k, v and dout as transformers hands them over (transpose(1, 2) of [B, N, H, D]
    tensors): the Gluon backward kernels (the dK/dV kernel adding dQ's shares up, or it and the
    ordered dQ kernel) read them in place through [B * N, H * D] views and store dK and dV in that
    order too (`INNER`; q and k pre-rotated by RoPE are contiguous, and so are the keys the dK/dV
    kernel rotates itself at head dim 64 for the ordered dQ kernel), compiled for sm 90."""
    chain = [ROPE.replace("%d", str(d))] if rope else []
    ir = variant(dtype=torch.bfloat16, hq=8, hkv=2, d=d, q_ops=chain, k_ops=chain, score_ops=["attn.mask {s} causal"])
    source = compile_module(
        parse_module(ir), sm=90, seq_len=4096, direction="bwd", wrt=(0, 1, 2), gluon_dq_reduce=reduce
    ).source
    module, kernels, real = _capturing(source, tmp_path)
    q, k, v, out, dout = (torch.zeros(2, 256, h, d, dtype=torch.bfloat16).transpose(1, 2) for h in (8, 2, 2, 8, 8))
    dq, dk, dv = module.launch(q, k, v, out, torch.zeros(2, 8, 256), dout)
    assert all(g.transpose(1, 2).is_contiguous() for g in (dq, dk, dv))  # as their inputs, as SDPA's
    ((dkdv_args, dkdv_kwargs),) = kernels["attn_bwd_sm90"].calls
    assert dkdv_kwargs["DQ"] is reduce
    # q, k, v, dO, dK, dV (q pre-rotated; K too at head dim 128, else rotated in the kernel; dK
    # back through K's RoPE in the kernel)
    k_inner = not rope or d == 64
    assert dkdv_kwargs["INNER"] == ((False, k_inner, True, True, True, True) if rope else (True,) * 6)
    launches = [("attn_bwd_sm90", (dkdv_args, dkdv_kwargs))]
    if not reduce:
        ((dq_args, dq_kwargs),) = kernels["attn_bwd_dq_sm90"].calls
        assert dq_kwargs["INNER"] == ((False, False, True, True) if rope else (True,) * 4)
        launches.append(("attn_bwd_dq_sm90", (dq_args, dq_kwargs)))
    assert len(kernels["attn_bwd_dq_sm90"].calls) == (0 if reduce else 1)
    for name, (args, kwargs) in launches:
        binary = compile_for_sm90(real[name], args, kwargs, num_warps=kwargs["num_warps"])
        assert 0 < binary.metadata.shared <= HOPPER_SMEM and "cp.async.bulk.tensor" in binary.asm["ptx"]


def _tensors(nq: int, nk: int, offset: int = 0, contiguous: bool = True) -> list[torch.Tensor]:
    flat = torch.zeros(8 * nq * 64 + offset, dtype=torch.float16)
    q = flat[offset:].view(1, 8, nq, 64)
    k, v = (torch.zeros(1, 2, nk, 64, dtype=torch.float16) for _ in range(2))
    dout = torch.zeros(1, 8, nq, 64, dtype=torch.float16)
    if not contiguous:
        dout = torch.zeros(1, nq, 8, 64, dtype=torch.float16).transpose(1, 2)
    return [q, k, v, dout, torch.zeros(1, 8, nq)]


@pytest.mark.parametrize(
    "nq,nk,offset,contiguous,fits",
    [
        (2048, 2048, 0, True, True),
        (1024, 1024, 0, True, False),  # below min_len
        (2000, 2000, 0, True, False),  # not a multiple of 128
        (2048, 4096, 0, True, False),  # Nq != Nk
        (2048, 2048, 4, True, False),  # q not 16-byte aligned
        (2048, 2048, 0, False, True),  # dout not contiguous: copied first
    ],
)
def test_gluon_bwd_fits(nq: int, nk: int, offset: int, contiguous: bool, fits: bool) -> None:
    assert gluon_bwd_launch._gluon_bwd_fits(*_tensors(nq, nk, offset, contiguous), 2048) is fits


def test_gluon_bwd_fits_needs_an_aligned_lse() -> None:
    """lse reaches the dK/dV kernel by TMA: a view of it 4 bytes past an alignment is refused."""
    *inputs, lse = _tensors(2048, 2048)
    shifted = torch.zeros(lse.numel() + 1)[1:].view(lse.shape)
    assert shifted.is_contiguous() and gluon_bwd_launch._gluon_bwd_fits(*inputs, lse, 2048)
    assert not gluon_bwd_launch._gluon_bwd_fits(*inputs, shifted, 2048)


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE of the `half` style over every channel at positions 0..N-1 (x [B, H, N, D])."""
    n, d = x.shape[2], x.shape[3]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, 1), torch.cat([angles.sin()] * 2, 1)
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize("norm", [False, True], ids=["rope", "qknorm-rope"])
def test_the_workspace_kernels_apply_the_chains_derivatives(norm: bool, tmp_path) -> None:
    """attn_bwd_dq_acc (and, with QK-norm, attn_bwd_dk_acc) under the interpreter: the fp32
    workspaces the Gluon kernel leaves, taken back through Q's and K's chains (dQ also times the
    scores' scale), against autograd of the chains written out here. The RoPE's pair partners
    come from a second read of the workspace."""
    d, n, scale = 64, 128, 0.125
    chain = ([NORM.replace("%d", str(d))] if norm else []) + [ROPE.replace("%d", str(d))]
    ir = variant(
        dtype=torch.float16,
        hq=4,
        hkv=2,
        d=d,
        q_ops=[c.replace("{W}", "q") for c in chain],
        k_ops=[c.replace("{W}", "k") for c in chain],
        qk=f"scale = {scale}",
        score_ops=["attn.mask {s} causal"],
        extras=["%wq: tensor<64xf32>", "%wk: tensor<64xf32>"] if norm else [],
    )
    source = compile_module(parse_module(ir), sm=90, seq_len=4096, direction="bwd", wrt=(0, 1, 2)).source
    assert "tl.gather" not in source.split("def attn_bwd_dq_acc", 1)[1].split("@triton.jit", 1)[0]
    path = tmp_path / "workspaces.py"
    path.write_text(source, encoding="utf-8")
    module = load_module(path, interpret=True, name=f"attnfuse_workspaces_{tmp_path.name}")
    g = torch.Generator().manual_seed(5)
    q, out, dout = (torch.randn(1, 4, n, d, generator=g).half() for _ in range(3))
    k, v = (torch.randn(1, 2, n, d, generator=g).half() for _ in range(2))
    weights = [torch.rand(d, generator=g) + 0.5 for _ in range(2)] if norm else []
    spaces = {}

    def fill(q_in, k_in, v_in, dout_in, lse, delta, dq_acc, dk, dv, *args, **kwargs):
        spaces["dq"] = torch.randn(dq_acc.shape, generator=g)
        dq_acc.copy_(spaces["dq"])
        spaces["dk"] = torch.randn(dk.shape, generator=g)
        dk.copy_(spaces["dk"].to(dk.dtype))
        dv.zero_()

    module._gluon_bwd_fits = lambda *args: True
    module._gluon_backward = fill
    with interpreter_library():  # Triton's own tl.sum... interpreted too
        dq, dk, _ = module.launch(q, k, v, *weights, out, torch.zeros(1, 4, n), dout)[:3]

    def expected(x: torch.Tensor, w: torch.Tensor | None, grad: torch.Tensor) -> torch.Tensor:
        x = x.double().requires_grad_()
        y = _rope(_rms(x, w.double()) if w is not None else x, 10000.0)
        return torch.autograd.grad(y, x, grad.double())[0]

    dq_ref = expected(q, weights[0] if norm else None, spaces["dq"] * scale)
    assert torch.allclose(dq.double(), dq_ref, rtol=2e-3, atol=2e-3)
    # dK: stored back through K's RoPE by the Gluon kernel itself, unless K's chain has more
    dk_ref = expected(k, weights[1], spaces["dk"]) if norm else spaces["dk"].half().double()
    assert torch.allclose(dk.double(), dk_ref, rtol=2e-3, atol=2e-3)
