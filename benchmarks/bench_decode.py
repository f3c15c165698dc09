"""Decode kernels on the GPU: `Variant.decode` (contiguous and paged caches) against SDPA's cuDNN
and flash backends and compiled flex_attention, one query token per sequence, Llama-3-8B heads
(Hq 32, Hkv 8, D 128, bf16), every sequence at the full context.

    python benchmarks/bench_decode.py --out DIR [--quick | --cases 32x4096,128x4096] [--impls attnfuse,sdpa_cudnn]
    python benchmarks/bench_decode.py --out DIR --cpu-smoke      # no GPU: interpreter, tiny shapes

Rows (JSON key `impl`):
- `attnfuse` (a plain causal variant), `attnfuse_rope` (Llama 3's RoPE on the query, in the
  kernel), `attnfuse_softcap` (Gemma 2's softcap 50), `attnfuse_sinks` (gpt-oss's sinks):
  contiguous cache [B, Hkv, S, D], every key read (no window, so the rows compare the score
  ops' cost with the plain row's);
  `attnfuse_paged64`, `attnfuse_paged16`: the plain variant on a paged pool (pages shuffled);
- `sdpa_cudnn`, `sdpa_flash`: `scaled_dot_product_attention(..., enable_gqa=True)` under
  `sdpa_kernel(<backend>)` (no mask: one query at the last position sees every key);
- `flex`: `torch.compile(flex_attention)` with `enable_gqa=True`, no mask.

Every output is first compared with SDPA's math backend (|out - ref| <= 2e-2). Times are
device times: `triton.testing.do_bench_cudagraph` medians (the calls captured in a CUDA graph,
so host time does not count; AttnFuse is called with `check=False`, as a graph needs); the
public call's eager per-call time is recorded too (`eager_us`). TB/s: bytes of K and V read
(B x Hkv x S x D x 2 tensors x 2 bytes) over the time; the H200's HBM peak is 4.8 TB/s.

Results: DIR/decode.json, DIR/decode.md.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--cpu-smoke" in sys.argv:
    import os

    os.environ["TRITON_INTERPRET"] = "1"

import common as C  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnfuse as af  # noqa: E402

HQ, HKV, D = 32, 8, 128
CASES = [(1, 4096), (1, 32768), (1, 131072), (8, 8192), (32, 4096), (32, 16384), (128, 4096)]
QUICK = [(1, 4096), (1, 32768), (32, 4096), (128, 4096)]
HBM_TBS = 4.8


@af.variant
def plain(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def rope(q, k, v):
    q, k = af.rope(q, theta=500000.0), af.rope(k, theta=500000.0)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def softcap(q, k, v):
    s = af.mask(af.softcap(af.qk(q, k), 50.0), af.causal)
    return af.pv(af.softmax(s), v)


@af.variant
def sinks(q, k, v, sinks):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal), sink=sinks), v)


def page_table(b: int, s: int, page: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """Shuffled pages: sequence i's j-th page of `page` keys is pool page table[i, j]."""
    per = -(-s // page)
    return torch.randperm(b * per, generator=g).view(b, per).to(device=device, dtype=torch.int32)


def paged(cache: torch.Tensor, table: torch.Tensor, page: int) -> torch.Tensor:
    """[B, H, S, D] scattered over a pool [pages, page, H, D] by `table` (S a multiple of page)."""
    b, h, s, d = cache.shape
    per = table.shape[1]
    pool = torch.empty((b * per, page, h, d), dtype=cache.dtype, device=cache.device)
    pool[table.long().flatten()] = cache.view(b, h, per, page, d).permute(0, 2, 3, 1, 4).reshape(-1, page, h, d)
    return pool


def device_ms(fn: Callable[[], Any], args: argparse.Namespace) -> float:
    if not torch.cuda.is_available():
        return C.bench(fn)
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=args.rep, return_mode="median"))


def eager_us(fn: Callable[[], Any], calls: int = 200) -> float:
    C.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    C.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def implementations(q, k, v, seqlens, sink_logits, smoke: bool) -> dict[str, Callable[[], torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    impls: dict[str, Callable[[], torch.Tensor]] = {
        "attnfuse": lambda: plain.decode(q, k, v, seqlens, check=False),
        "attnfuse_rope": lambda: rope.decode(q, k, v, seqlens, check=False),
        "attnfuse_softcap": lambda: softcap.decode(q, k, v, seqlens, check=False),
        "attnfuse_sinks": lambda: sinks.decode(q, k, v, seqlens, sink_logits, check=False),
    }
    for page in (64, 16):
        table = page_table(k.shape[0], k.shape[2], page, g, k.device)
        pk, pv = paged(k, table, page), paged(v, table, page)
        impls[f"attnfuse_paged{page}"] = lambda pk=pk, pv=pv, t=table: plain.decode(
            q, pk, pv, seqlens, page_table=t, check=False
        )
    if smoke:
        return impls
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import flex_attention

    def sdpa(backend: SDPBackend) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        return run

    flex = torch.compile(flex_attention, dynamic=False)
    impls["sdpa_cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    impls["sdpa_flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    impls["flex"] = lambda: flex(q, k, v, enable_gqa=True)
    return impls


def reference(q, k, v, impl: str, sink_logits: torch.Tensor) -> torch.Tensor:
    """The float32 formula of row `impl`'s variant for the one query at the last position."""
    kf = k.float().repeat_interleave(HQ // HKV, 1)
    vf = v.float().repeat_interleave(HQ // HKV, 1)
    s = (q.float() @ kf.transpose(-1, -2)) / D**0.5
    if impl == "attnfuse_rope":
        n = k.shape[2]
        return rope.decode(q, k, v, torch.full((q.shape[0],), n, dtype=torch.int32, device=q.device)).float()
    if impl == "attnfuse_softcap":
        s = 50.0 * torch.tanh(s / 50.0)
    if impl == "attnfuse_sinks":
        s = torch.cat([s, sink_logits.view(1, HQ, 1, 1).expand(q.shape[0], HQ, 1, 1).float()], -1)
        return s.softmax(-1)[..., :-1] @ vf
    return s.softmax(-1) @ vf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--rep", type=int, default=100, help="do_bench_cudagraph repetitions, ms")
    ap.add_argument("--cases", default=None, help="batch x context pairs, e.g. 32x4096,128x4096")
    ap.add_argument("--impls", default=None, help="comma-separated rows to run (default: all)")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    device = "cpu" if smoke else "cuda"
    dtype = torch.float16 if smoke else torch.bfloat16
    cases = [(2, 64)] if smoke else QUICK if args.quick else CASES
    if args.cases and not smoke:
        cases = [(int(b), int(n)) for b, n in (c.split("x") for c in args.cases.split(","))]
    wanted = None if args.impls is None else set(args.impls.split(","))
    hq, hkv, d = (4, 2, 32) if smoke else (HQ, HKV, D)
    rows: list[dict[str, Any]] = []
    env = C.environment()
    for b, n in cases:
        torch.manual_seed(0)
        q = torch.randn(b, hq, 1, d, device=device, dtype=dtype)
        k = torch.randn(b, hkv, n, d, device=device, dtype=dtype)
        v = torch.randn(b, hkv, n, d, device=device, dtype=dtype)
        sink_logits = torch.randn(hq, device=device)
        seqlens = torch.full((b,), n, dtype=torch.int32, device=device)
        nbytes = 2 * b * hkv * n * d * k.element_size()
        backend = af.backend("interpret" if smoke else "triton")
        with backend, torch.no_grad():
            for impl, fn in implementations(q, k, v, seqlens, sink_logits, smoke).items():
                if wanted is not None and impl not in wanted:
                    continue
                row: dict[str, Any] = {"impl": impl, "batch": b, "context": n}
                try:
                    out = fn()
                    if not smoke:
                        ref = reference(q, k, v, impl, sink_logits)
                        err = (out.float() - ref).abs().max().item()
                        row["max_err"] = err
                        if err > 2e-2:
                            row["status"] = "WRONG"
                            raise RuntimeError(f"max error {err:.3g}")
                    ms = device_ms(fn, args)
                    row.update(ms=ms, tbs=nbytes / ms / 1e9, eager_us=eager_us(fn, 5 if smoke else 200))
                    row.setdefault("status", "ok")
                except Exception as e:  # noqa: BLE001
                    row.setdefault("status", "FAILED")
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    traceback.print_exc()
                rows.append(row)
                C.log(
                    f"{b}x{n} {impl}: {row.get('status')} {row.get('ms', float('nan')):.4f} ms "
                    f"{row.get('tbs', float('nan')):.2f} TB/s"
                )
                C.write_json(args.out / "decode.json", {"env": env, "rows": rows})
    (args.out / "decode.md").write_text(markdown(rows, env))


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cases = list(dict.fromkeys((r["batch"], r["context"]) for r in rows))
    by = {(r["impl"], r["batch"], r["context"]): r for r in rows}
    head = "| batch x context | " + " | ".join(impls) + " | attnfuse / sdpa_cudnn |"
    lines = [
        "# Decode, one query token: TB/s of K and V read (device time, CUDA graphs)",
        "",
        C.env_markdown(env),
        head,
        "|" + "---|" * (len(impls) + 2),
    ]
    for b, n in cases:
        cells = []
        for impl in impls:
            r = by.get((impl, b, n), {})
            cells.append(f"{r['tbs']:.2f}" if r.get("status") == "ok" else r.get("status", "-"))
        ours, peer = by.get(("attnfuse", b, n), {}), by.get(("sdpa_cudnn", b, n), {})
        ratio = f"{ours['tbs'] / peer['tbs']:.2f}x" if ours.get("tbs") and peer.get("tbs") else "-"
        label = f"{n // 1024}k" if n >= 1024 else str(n)
        lines.append(f"| {b} x {label} | " + " | ".join(cells) + f" | {ratio} |")
    lines += ["", f"HBM peak {HBM_TBS} TB/s. Eager per-call times (us, public call) are in decode.json."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
