"""The generic Triton kernel's tanh (softcap) by the GPU's approximate instruction against the
exact form, forward and backward, on the GPU, in one process (kernel-path's `tanh` option).

    python benchmarks/tanh_approx.py --out DIR [--ns 2048,4096,8192]

A Gemma-2 style softcap (cap 50) with a causal mask at three shapes, on the generic kernel
(`gluon=false`): the paper shape (B 4, H 12, D 64, fp16), Gemma-2-9B's attention (B 1, Hq 16,
Hkv 8, D 256, bf16: the Gluon kernel does not take head dim 256) and Llama-3-8B's (B 1, Hq 32,
Hkv 8, D 128, bf16). Each variant is compiled twice (`tanh="approx"` and `tanh="exact"`), forward
(`launch(q, k, v)`) and backward (`launch(q, k, v, out, lse, dout)`), and timed as do_bench
medians. Accuracy: out, dq, dk and dv of both against a float32 formula (the largest error
relative to the reference's largest magnitude), at the shortest N only.

Writes DIR/tanh_approx.json and DIR/tanh_approx.md. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402
import torch  # noqa: E402

from attnfuse.cache import load_source  # noqa: E402
from attnfuse.compiler import compile_module  # noqa: E402
from attnfuse.ir import parse_module  # noqa: E402

CAP = 50.0
SHAPES = {  # name: (B, Hq, Hkv, D, dtype)
    "paper": (4, 12, 12, 64, torch.float16),
    "gemma2-9b": (1, 16, 8, 256, torch.bfloat16),
    "llama3-8b": (1, 32, 8, 128, torch.bfloat16),
}


def variant_ir(b_hq_hkv_d_dt: tuple) -> str:
    _, hq, hkv, d, dt = b_hq_hkv_d_dt
    et = C.MLIR_DTYPES[dt]
    tq, tk = f"tensor<?x{hq}x?x{d}x{et}>", f"tensor<?x{hkv}x?x{d}x{et}>"
    return f"""func.func @softcap(%q: {tq}, %k: {tk}, %v: {tk}) -> {tq} {{
  %s = attn.qk %q, %k : {tq}, {tk} -> !attn.scores<{hq}>
  %c = attn.softcap %s cap = {CAP} : !attn.scores<{hq}>
  %m = attn.mask %c causal : !attn.scores<{hq}>
  %p = attn.softmax %m : !attn.scores<{hq}> -> !attn.probs<{hq}>
  %o = attn.pv %p, %v : !attn.probs<{hq}>, {tk} -> {tq}
  func.return %o : {tq}
}}"""


def reference(q, k, v, do):
    """out, dq, dk, dv of softcapped causal attention in float32 (autograd)."""
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(group, dim=1) for x in (k, v))
    s = (q @ kk.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = CAP * torch.tanh(s / CAP)
    n = q.shape[2]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    out = torch.softmax(s, dim=-1) @ vv
    out.backward(do.float())
    return out.detach(), q.grad, k.grad, v.grad


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref).abs().max() / ref.abs().max()).item()


def kernels(ir: str, sm: int, n: int, tanh: str):
    """The forward and backward modules of `ir` on the generic kernel."""
    return tuple(
        load_source(
            compile_module(parse_module(ir), sm=sm, seq_len=n, direction=d, gluon=False, tanh=tanh).source,
            C.source_dir(),
            interpret=False,
        )
        for d in ("fwd", "bwd")
    )


def measure(shape: str, n: int, sm: int, accuracy: bool) -> dict:
    """One row: both tanh forms' forward and backward times (and errors when `accuracy`)."""
    b, hq, hkv, d, dt = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(n)
    # q·kᵀ/sqrt(d) of up to a few tens: the softcap bends the scores
    q, k, v, do = (
        torch.randn(b, h, n, d, device="cuda", dtype=dt, generator=g) * scale
        for h, scale in ((hq, 3.0), (hkv, 3.0), (hkv, 1.0), (hq, 1.0))
    )
    row: dict = {"shape": shape, "n": n}
    results = {}
    for impl in ("approx", "exact"):
        fwd, bwd = kernels(variant_ir(SHAPES[shape]), sm, n, impl)
        if (impl == "approx") != hasattr(fwd, "_fast_tanh"):
            raise SystemExit(f"{shape}: tanh={impl} but the module {'lacks' if impl == 'approx' else 'has'} _fast_tanh")
        out, lse = fwd.launch(q, k, v)
        results[impl] = (out, *bwd.launch(q, k, v, out, lse, do))
        row[f"{impl}_fwd_ms"] = C.bench(lambda fwd=fwd, xs=(q, k, v): fwd.launch(*xs))
        row[f"{impl}_bwd_ms"] = C.bench(lambda bwd=bwd, xs=(q, k, v, out, lse, do): bwd.launch(*xs))
    row["fwd_speedup"] = row["exact_fwd_ms"] / row["approx_fwd_ms"]
    row["bwd_speedup"] = row["exact_bwd_ms"] / row["approx_bwd_ms"]
    if accuracy:
        ref = reference(q, k, v, do)
        for impl, got in results.items():
            row[f"{impl}_err"] = {
                name: rel_err(x, r) for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref, strict=True)
            }
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ns", default="2048,4096,8192")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tanh_approx.py needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    env, rows = C.environment(), []
    sm = C.device_sm()
    ns = sorted(int(x) for x in args.ns.split(","))
    for shape in args.shapes.split(","):
        for n in ns:
            row = measure(shape, n, sm, accuracy=n == ns[0])
            rows.append(row)
            err = f" | err approx {row['approx_err']} exact {row['exact_err']}" if "approx_err" in row else ""
            C.log(
                f"{shape:10s} N={n:6d} fwd exact {row['exact_fwd_ms']:.3f} approx {row['approx_fwd_ms']:.3f} ms "
                f"x{row['fwd_speedup']:.2f} | bwd exact {row['exact_bwd_ms']:.3f} approx {row['approx_bwd_ms']:.3f} "
                f"ms x{row['bwd_speedup']:.2f}{err}"
            )
            C.write_json(args.out / "tanh_approx.json", {"environment": env, "rows": rows})
            torch.cuda.empty_cache()
    lines = [
        C.env_markdown(env),
        "",
        "Generic kernel, softcap 50 + causal; ms are do_bench medians; speedup = exact / approx.",
        "",
        "| shape | N | fwd exact ms | fwd approx ms | fwd speedup | bwd exact ms | bwd approx ms | bwd speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['shape']} | {r['n']} | {r['exact_fwd_ms']:.3f} | {r['approx_fwd_ms']:.3f} | {r['fwd_speedup']:.2f} | "
        f"{r['exact_bwd_ms']:.3f} | {r['approx_bwd_ms']:.3f} | {r['bwd_speedup']:.2f} |"
        for r in rows
    ]
    lines += ["", "Error against float32 (max |x - ref| / max |ref|), shortest N:", ""]
    lines += ["| shape | tanh | out | dq | dk | dv |", "|---|---|---|---|---|---|"]
    for r in rows:
        for impl in ("exact", "approx"):
            if f"{impl}_err" in r:
                e = r[f"{impl}_err"]
                lines.append(
                    f"| {r['shape']} | {impl} | {e['out']:.1e} | {e['dq']:.1e} | {e['dk']:.1e} | {e['dv']:.1e} |"
                )
    (args.out / "tanh_approx.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
