"""The attention backward in isolation vs between large GEMMs (as in a training step), ours vs cuDNN:
kernel times by torch.profiler. Plain causal, Llama-3-8B shape, N from argv."""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnfuse as af

out = Path(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
torch.manual_seed(0)
b, hq, hkv, d = 1, 32, 8, 128


@af.variant
def causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
o_ours = causal(q, k, v)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    o_cudnn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
a = torch.randn(n, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16)


def bwd(o):
    torch.autograd.grad(o, (q, k, v), g, retain_graph=True)


def run(mode, o, reps=30):
    for _ in range(5):
        bwd(o)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if mode == "gemm":
                a @ w
                a @ w
            bwd(o)
        torch.cuda.synchronize()
    res = {}
    for e in prof.key_averages():
        if (
            e.device_type == torch.autograd.DeviceType.CUDA
            and e.count >= reps
            and (
                "attn" in e.key or "bprop" in e.key or "nvjet" in e.key or "gemm" in e.key.lower() or "rotate" in e.key
            )
        ):
            res[e.key[:60]] = round(e.self_device_time_total / e.count, 1)
    return res


rows = []
for rnd in range(2):
    for mode in ("alone", "gemm", "long"):
        for name, o in (("attnfuse", o_ours), ("cudnn", o_cudnn)):
            r = run(mode, o, 400 if mode == "long" else 30)
            rows.append(dict(round=rnd, mode=mode, impl=name, kernels_us=r))
            print(rnd, mode, name, r, flush=True)
(out / f"context_{n}.json").write_text(json.dumps(rows, indent=1))
