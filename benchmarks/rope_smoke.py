# The timed lambdas are called at once by do_bench inside the loop that defines them.
# ruff: noqa: B023
"""First H200 measurement of the RoPE+causal kernel: correctness on CUDA (fp16, bf16, both
rope-fusion modes) against the reference, then timings against SDPA cuDNN and flash."""

import importlib.util
import os
import tempfile

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.reference import run_reference

print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)


def load(src):
    d = tempfile.mkdtemp()
    path = os.path.join(d, "k.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"g{abs(hash(src))}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


base = open("attnfuse/examples/llama3_rope_causal.mlir").read()
plain = base.replace("attn.qk %qr, %kr", "attn.qk %q, %k")
lines = [l for l in plain.splitlines() if "attn.rope" not in l]
plain = "\n".join(lines)


def shape(text, H, HK, D, dt):
    return (
        text.replace("?x32x?x128x", "@Q@")
        .replace("?x8x?x128x", "@K@")
        .replace("@Q@", f"?x{H}x?x{D}x")
        .replace("@K@", f"?x{HK}x?x{D}x")
        .replace("rotary_dim = 128", f"rotary_dim = {D}")
        .replace("bf16", dt)
        .replace("<32>", f"<{H}>")
    )


def rope_torch(x, inv, pos):
    ang = pos[:, None].float() * inv[None, :].float()
    c, s = ang.cos(), ang.sin()
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)


# correctness
for dt, tdt in [("f16", torch.float16), ("bf16", torch.bfloat16)]:
    for B, H, HK, NQ, NK, D in [(2, 8, 2, 1000, 1000, 128), (1, 8, 2, 1, 777, 128), (2, 4, 4, 300, 300, 64)]:
        text = shape(base, H, HK, D, dt)
        mod = parse_module(text)
        q = torch.randn(B, H, NQ, D, device="cuda", dtype=tdt)
        k = torch.randn(B, HK, NK, D, device="cuda", dtype=tdt)
        v = torch.randn(B, HK, NK, D, device="cuda", dtype=tdt)
        ref = run_reference(mod, q.cpu(), k.cpu(), v.cpu(), compute_dtype=torch.float32)
        for mode in ["fused", "prerotate"]:
            try:
                m = load(compile_module(mod, sm=90, seq_len=NK, rope_mode=mode).source)
                out, lse = m.launch(q, k, v)
                torch.cuda.synchronize()
                print(
                    f"rope_causal {dt} B{B} H{H}/{HK} Nq{NQ} Nk{NK} D{D} {mode}: "
                    f"max err {(out.float().cpu() - ref).abs().max().item():.3e}",
                    flush=True,
                )
            except Exception as e:
                print("FAIL", dt, mode, type(e).__name__, str(e)[:2000], flush=True)
# timing: paper shape fp16 and llama bf16
for name, B, H, HK, D, dt, tdt in [
    ("paper", 4, 12, 12, 64, "f16", torch.float16),
    ("llama", 1, 32, 8, 128, "bf16", torch.bfloat16),
]:
    for N in [1024, 4096, 16384]:
        q = torch.randn(B, H, N, D, device="cuda", dtype=tdt)
        k = torch.randn(B, HK, N, D, device="cuda", dtype=tdt)
        v = torch.randn(B, HK, N, D, device="cuda", dtype=tdt)
        res = {}
        for label, text, mode in [
            ("causal", shape(plain, H, HK, D, dt), "auto"),
            ("rope_fused", shape(base, H, HK, D, dt), "fused"),
            ("rope_pre", shape(base, H, HK, D, dt), "prerotate"),
        ]:
            try:
                m = load(compile_module(parse_module(text), sm=90, seq_len=N, rope_mode=mode).source)
                res[label] = do_bench(lambda: m.launch(q, k, v), warmup=25, rep=100, return_mode="median")
            except Exception as e:
                res[label] = f"ERR {type(e).__name__}: {str(e)[:300]}"
        kk = k.repeat_interleave(H // HK, 1)
        vv = v.repeat_interleave(H // HK, 1)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for be, lab in [(SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")]:
            try:
                with sdpa_kernel(be):
                    res[lab] = do_bench(
                        lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True),
                        warmup=25,
                        rep=100,
                        return_mode="median",
                    )
            except Exception as e:
                res[lab] = f"ERR {e}"[:200]
        fl = 2 * B * H * N * N * D
        print(
            name,
            N,
            {k2: (f"{v2:.3f}ms {fl / v2 * 1e-9:.0f}TF" if isinstance(v2, float) else v2) for k2, v2 in res.items()},
            flush=True,
        )
