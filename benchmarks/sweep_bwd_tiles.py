"""Tile sweep of the backward kernels (the `bwd` class of `passes/tiling.py`) on the GPU.

    python benchmarks/sweep_bwd_tiles.py --out DIR [--n-paper 4096] [--n-llama 8192]

RoPE + causal at the paper shape (B4 H12 D64 fp16) and the Llama-3-8B shape (B1 Hq32
Hkv8 D128 bf16): for BLOCK_M (rows a program owns) in {64, 128}, BLOCK_N (rows per loop
step) in {32, 64}, num_warps in {4, 8}, num_stages in {2, 3}, the whole backward
launch (delta, the two pre-rotations, dK/dV and dQ) is checked against float32 autograd of
a plain PyTorch formula, then timed (do_bench median). cuDNN's backward (SDPA, RoPE
excluded) is timed in the same run for scale. Writes DIR/bwd_tiles.json and DIR/bwd_tiles.md
with the winner per shape.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from attnfuse.compiler import compile_module  # noqa: E402
from attnfuse.ir import parse_module  # noqa: E402
from attnfuse.rope_freqs import inv_freq  # noqa: E402

SHAPES = {
    "paper": dict(b=4, hq=12, hkv=12, d=64, dtype=torch.float16, theta=10000.0),
    "llama": dict(b=1, hq=32, hkv=8, d=128, dtype=torch.bfloat16, theta=500000.0),
}
CONFIGS = list(itertools.product((64, 128), (32, 64), (4, 8), (2, 3)))


def ir(hq: int, hkv: int, d: int, e: str, theta: float) -> str:
    qt, kt = f"tensor<?x{hq}x?x{d}x{e}>", f"tensor<?x{hkv}x?x{d}x{e}>"
    rope = f"half theta = {theta} rotary_dim = {d}"
    return f"""func.func @rope_causal(%q: {qt}, %k: {kt}, %v: {kt}) -> {qt} {{
  %qr = attn.rope %q {rope} : {qt}
  %kr = attn.rope %k {rope} : {kt}
  %s = attn.qk %qr, %kr : {qt}, {kt} -> !attn.scores<{hq}>
  %m = attn.mask %s causal : !attn.scores<{hq}>
  %p = attn.softmax %m : !attn.scores<{hq}> -> !attn.probs<{hq}>
  %o = attn.pv %p, %v : !attn.probs<{hq}>, {kt} -> {qt}
  func.return %o : {qt}
}}"""


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    d, n = x.shape[-1], x.shape[-2]
    freqs = torch.tensor(inv_freq(theta, d, None)[0], dtype=torch.float32, device=x.device)
    ang = torch.arange(n, device=x.device, dtype=torch.float32)[:, None] * freqs[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_grads(q, k, v, dout, theta):
    xs = [t.float().detach().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(
        rope(xs[0], theta), rope(xs[1], theta), xs[2], is_causal=True, enable_gqa=q.shape[1] != k.shape[1]
    )
    return torch.autograd.grad(out, xs, dout.float())


def run_shape(name: str, n: int, rows: list[dict]) -> None:
    s = SHAPES[name]
    dtype, e = s["dtype"], "bf16" if s["dtype"] == torch.bfloat16 else "f16"
    module = parse_module(ir(s["hq"], s["hkv"], s["d"], e, s["theta"]))
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(s["b"], s["hq"], n, s["d"], device="cuda", dtype=dtype, generator=g)
    k = torch.randn(s["b"], s["hkv"], n, s["d"], device="cuda", dtype=dtype, generator=g)
    v = torch.randn(s["b"], s["hkv"], n, s["d"], device="cuda", dtype=dtype, generator=g)
    fwd = C.load_source(compile_module(module, sm=90, seq_len=n).source)
    out, lse = fwd.launch(q, k, v)
    dout = torch.randn_like(out)
    refs = reference_grads(q, k, v, dout, s["theta"])
    flops = 2.5 * 4 * s["b"] * s["hq"] * n * n * s["d"] / 2
    # cuDNN's backward alone, for scale (no RoPE).
    xs = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(*xs, is_causal=True, enable_gqa=s["hq"] != s["hkv"])
        cudnn_ms = C.bench(lambda: torch.autograd.grad(o, xs, dout, retain_graph=True))
    C.log(f"{name} N={n}: cuDNN backward {cudnn_ms:.3f} ms ({flops / cudnn_ms / 1e9:.0f} TFLOP/s)")
    rows.append(dict(shape=name, n=n, config="cudnn", ms=cudnn_ms, tflops=flops / cudnn_ms / 1e9))
    for bm, bn, warps, stages in CONFIGS:
        cfg = f"{bm}/{bn}/w{warps}/s{stages}"
        try:
            src = compile_module(
                module,
                sm=90,
                seq_len=n,
                direction="bwd",
                block_m=bm,
                block_n=bn,
                num_warps=warps,
                num_stages=stages,
            ).source
            bwd = C.load_source(src)
            grads = bwd.launch(q, k, v, out, lse, dout)
            errs = [((a.float() - r).norm() / r.norm()).item() for a, r in zip(grads, refs, strict=True)]
            ok = max(errs) < (3e-2 if dtype == torch.bfloat16 else 6e-3)
            ms = C.bench(lambda bwd=bwd: bwd.launch(q, k, v, out, lse, dout)) if ok else math.nan
            row = dict(shape=name, n=n, config=cfg, ms=ms, tflops=flops / ms / 1e9, max_rel_l2=max(errs), ok=ok)
        except Exception as ex:  # a config Triton cannot build (shared memory) is recorded, not fatal
            row = dict(shape=name, n=n, config=cfg, error=f"{type(ex).__name__}: {str(ex)[:200]}")
            traceback.print_exc(limit=1)
        C.log(str(row))
        rows.append(row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-paper", type=int, default=4096)
    ap.add_argument("--n-llama", type=int, default=8192)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    run_shape("paper", args.n_paper, rows)
    run_shape("llama", args.n_llama, rows)
    C.write_json(args.out / "bwd_tiles.json", {"environment": C.environment(), "rows": rows})
    lines = ["# Backward tile sweep (RoPE + causal)", "", C.env_markdown(C.environment()), ""]
    for name in SHAPES:
        ok = sorted((r for r in rows if r["shape"] == name and r.get("ok")), key=lambda r: r["ms"])
        ref = next(r for r in rows if r["shape"] == name and r["config"] == "cudnn")
        lines += [f"## {name} (N={ref['n']}): cuDNN backward {ref['ms']:.3f} ms, {ref['tflops']:.0f} TFLOP/s", ""]
        lines += ["| config (BLOCK_M/BLOCK_N/warps/stages) | ms | TFLOP/s | vs cuDNN |", "|---|---|---|---|"]
        for r in ok[:10]:
            lines.append(f"| {r['config']} | {r['ms']:.3f} | {r['tflops']:.0f} | {ref['ms'] / r['ms']:.2f}x |")
        bad = [r for r in rows if r["shape"] == name and r["config"] != "cudnn" and not r.get("ok")]
        lines += ["", f"{len(bad)} configurations failed or were wrong.", ""]
    (args.out / "bwd_tiles.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
