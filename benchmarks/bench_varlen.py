"""Packed batches of sequences of different lengths on the GPU: `Variant.varlen` against SDPA on
nested (jagged) tensors and compiled flex_attention with a document BlockMask, forward and
forward + backward, causal, Llama-3-8B heads (Hq 32, Hkv 8, D 128, bf16), 16384 tokens in all.

    python benchmarks/bench_varlen.py --out DIR
    python benchmarks/bench_varlen.py --out DIR --cpu-smoke      # no GPU: interpreter, tiny shapes

Batches: `16x~1k` (16 sequences, lengths uniform in [256, 1792] scaled to 16384 tokens) and
`64x~256` (64 sequences, [64, 448]). Rows:
- `attnfuse`: `plain.varlen(...)` (causal), `attnfuse_rope`: Llama 3's RoPE fused as well;
- `sdpa_nested`: `scaled_dot_product_attention(is_causal=True)` on jagged nested tensors
  (`torch.nested.nested_tensor_from_jagged`), K and V repeated to Hq heads (nested SDPA takes
  no `enable_gqa`);
- `flex_document`: compiled `flex_attention` on the packed [1, H, T, D] with a BlockMask of
  same-document and causal-within-document, `enable_gqa=True`.

Outputs are checked against each other (|a - b| <= 2e-2) before timing; do_bench medians; TFLOP/s
at 4 Hq D per kept (query, key) pair forward, 2.5x that backward.
Results: DIR/varlen.json, DIR/varlen.md.
"""

from __future__ import annotations

import argparse
import sys
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


@af.variant
def plain(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def rope(q, k, v):
    q, k = af.rope(q, theta=500000.0), af.rope(k, theta=500000.0)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def lengths(n_seqs: int, lo: int, hi: int, total: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(lo, hi + 1, (n_seqs,), generator=g).double()
    out = (raw / raw.sum() * total).floor().long().tolist()
    out[-1] += total - sum(out)
    return out


def implementations(q, k, v, lens: list[int], smoke: bool) -> dict[str, Callable[[], torch.Tensor]]:
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=q.device)
    m = max(lens)
    impls: dict[str, Callable[[], torch.Tensor]] = {
        "attnfuse": lambda: plain.varlen(q, k, v, cu, cu, m, m, check=False),
        "attnfuse_rope": lambda: rope.varlen(q, k, v, cu, cu, m, m, check=False),
    }
    if smoke:
        return impls
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = q.shape[1] // k.shape[1]
    offsets = cu.long()

    def sdpa_nested() -> torch.Tensor:
        qn = torch.nested.nested_tensor_from_jagged(q, offsets).transpose(1, 2)
        kn = torch.nested.nested_tensor_from_jagged(k.repeat_interleave(g, 1), offsets).transpose(1, 2)
        vn = torch.nested.nested_tensor_from_jagged(v.repeat_interleave(g, 1), offsets).transpose(1, 2)
        return F.scaled_dot_product_attention(qn, kn, vn, is_causal=True).transpose(1, 2).values()

    doc = torch.repeat_interleave(torch.arange(len(lens), device=q.device), torch.tensor(lens, device=q.device))
    start = cu.long()[:-1][doc]

    def mask_mod(b, h, qi, ki):  # type: ignore[no-untyped-def]
        return (doc[qi] == doc[ki]) & (ki <= qi) & (ki >= start[qi])

    total = q.shape[0]
    block_mask = create_block_mask(mask_mod, 1, 1, total, total, device=q.device)
    flex = torch.compile(flex_attention, dynamic=False)

    def flex_document() -> torch.Tensor:
        out = flex(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            block_mask=block_mask,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)

    impls["sdpa_nested"] = sdpa_nested
    impls["flex_document"] = flex_document
    return impls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    device, dtype = ("cpu", torch.float16) if smoke else ("cuda", torch.bfloat16)
    hq, hkv, d = (4, 2, 32) if smoke else (HQ, HKV, D)
    batches = (
        {"3x~40": lengths(3, 20, 60, 120, 0)}
        if smoke
        else {
            "16x~1k": lengths(16, 256, 1792, 16384, 0),
            "64x~256": lengths(64, 64, 448, 16384, 1),
        }
    )
    env = C.environment()
    rows: list[dict[str, Any]] = []
    for name, lens in batches.items():
        torch.manual_seed(0)
        total = sum(lens)
        q = torch.randn(total, hq, d, device=device, dtype=dtype)
        k = torch.randn(total, hkv, d, device=device, dtype=dtype)
        v = torch.randn(total, hkv, d, device=device, dtype=dtype)
        pairs = sum(n * (n + 1) / 2 for n in lens)
        flops = 4 * hq * d * pairs
        reference = None
        with af.backend("interpret" if smoke else "triton"):
            for impl, fn in implementations(q, k, v, lens, smoke).items():
                row: dict[str, Any] = {"batch": name, "impl": impl, "sequences": len(lens), "tokens": total}
                try:
                    with torch.no_grad():
                        out = fn()
                    if impl != "attnfuse_rope":
                        if reference is None:
                            reference = out.float()
                        err = (out.float() - reference).abs().max().item()
                        row["max_diff"] = err
                        if err > 2e-2:
                            row["status"] = "WRONG"
                            raise RuntimeError(f"differs from attnfuse by {err:.3g}")
                    with torch.no_grad():
                        row["fwd_ms"] = C.bench(fn)
                    row["fwd_tflops"] = flops / row["fwd_ms"] / 1e9
                    for t in (q, k, v):
                        t.requires_grad_(True)
                    grad = torch.randn_like(out)

                    def step(fn=fn, grad=grad) -> None:
                        fn().backward(grad)

                    row["fwd_bwd_ms"] = C.bench(step)
                    row["fwd_bwd_tflops"] = 3.5 * flops / row["fwd_bwd_ms"] / 1e9
                    row.setdefault("status", "ok")
                except Exception as e:  # noqa: BLE001
                    row.setdefault("status", "FAILED")
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    traceback.print_exc()
                finally:
                    for t in (q, k, v):
                        t.requires_grad_(False)
                        t.grad = None
                rows.append(row)
                C.log(
                    f"{name} {impl}: {row['status']} fwd {row.get('fwd_ms', float('nan')):.3f} ms, "
                    f"fwd+bwd {row.get('fwd_bwd_ms', float('nan')):.3f} ms"
                )
                C.write_json(args.out / "varlen.json", {"env": env, "rows": rows})
    (args.out / "varlen.md").write_text(markdown(rows, env))


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [
        "# Varlen: packed causal batches of 16384 tokens, Llama-3-8B heads, bf16",
        "",
        C.env_markdown(env),
        "| batch | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def f(key: str, r: dict[str, Any] = r) -> str:
            return f"{r[key]:.3f}" if isinstance(r.get(key), float) else "-"

        lines.append(
            f"| {r['batch']} | {r['impl']} | {f('fwd_ms')} | {f('fwd_tflops')} | {f('fwd_bwd_ms')} | "
            f"{f('fwd_bwd_tflops')} | {r['status']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
