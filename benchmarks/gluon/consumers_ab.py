"""The sm90 Gluon forward's consumer schedules (issue 22, items 1-3), against the generic Triton
kernel and SDPA cuDNN, in one process.

    python benchmarks/gluon/consumers_ab.py --out DIR [--head-dim 64|128|256] [--ns 2048,4096,8192,16384]
        [--schedules 3wg,2wg]

Head dim 64: the paper shape (B 4, H 12, fp16); 128: Llama-3-8B's (B 1, Hq 32, Hkv 8, bf16);
256: Gemma-2-9B's (B 1, Hq 16, Hkv 8, bf16). Plain causal and RoPE + causal. Each variant's
module is compiled once with kernel-path head-dims 64,128,256 and run with the Gluon kernel's
consumer schedule set per row (`_GL_CONSUMERS[d]` of the loaded module: (warpgroups,
ping-pong), at every N; --schedules: a subset), and
kernel-path's min-len lowered to 512 so that short N take the Gluon kernel too; the
generic row is the same variant compiled with gluon=false. SDPA cuDNN computes plain causal (for
RoPE + causal: after a RoPE compiled per shape, `dynamic=False`). Every output is checked against
the generic kernel's first (max abs difference <= 2e-2). Medians of `triton.testing.do_bench`.
Writes DIR/consumers_d<D>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common as C  # noqa: E402
from kernel_harness import variant  # noqa: E402

from attnfuse.cache import load_source  # noqa: E402
from attnfuse.compiler import compile_module  # noqa: E402
from attnfuse.ir import parse_module  # noqa: E402

CAUSAL = "attn.mask {s} causal"
SHAPES = {64: (4, 12, 12, torch.float16), 128: (1, 32, 8, torch.bfloat16), 256: (1, 16, 8, torch.bfloat16)}
"""Per head dim: batch, Hq, Hkv, dtype."""
SCHEDULES = {
    64: {"3wg": (3, False), "3wg_pingpong": (3, True), "2wg": (2, False), "2wg_pingpong": (2, True)},
    128: {"2wg_pingpong": (2, True), "2wg": (2, False)},
    256: {"2wg_pingpong": (2, True), "2wg": (2, False), "1wg": (1, False)},
}


def variants(d: int) -> dict[str, dict]:
    rope = f"attn.rope {{x}} half theta = 10000.0 rotary_dim = {d}"
    return {"causal": dict(score_ops=[CAUSAL]), "rope_causal": dict(q_ops=[rope], k_ops=[rope], score_ops=[CAUSAL])}


def _rope(q, k, cos, sin):
    return C.rope_half(q, cos, sin), C.rope_half(k, cos, sin)


def case(name: str, pieces: dict, d: int, n: int, rope, folder: Path, schedules: dict) -> dict:
    """Times (ms) and differences of one variant at head dim d and length n: the generic kernel,
    each schedule, and cuDNN (after a compiled RoPE for a RoPE variant)."""
    b, hq, hkv, dtype = SHAPES[d]
    ir = variant(dtype=dtype, hq=hq, hkv=hkv, d=d, **pieces)
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    gen = load_source(compile_module(parse_module(ir), sm=90, seq_len=n, gluon=False).source, folder, interpret=False)
    glu = load_source(
        compile_module(
            parse_module(ir),
            sm=90,
            seq_len=n,
            gluon_head_dims=(64, 128, 256),
            gluon_min_len=512,
            gluon_min_len_transformed=512,
        ).source,
        folder,
        interpret=False,
    )
    ref = gen.launch(q, k, v)[0]
    ms = {"generic": triton.testing.do_bench(lambda: gen.launch(q, k, v), return_mode="median")}
    err = {}
    for label, schedule in schedules.items():
        glu._GL_CONSUMERS[d] = schedule
        glu._GL_CONSUMERS_SHORT.clear()  # this schedule at every N
        glu._GL_BINARIES.clear()
        err[label] = (glu.launch(q, k, v)[0].float() - ref.float()).abs().max().item()
        ms[label] = triton.testing.do_bench(lambda: glu.launch(q, k, v), return_mode="median")
    cos, sin = (t.to(dtype) for t in C.rope_tables(n, d, "cuda"))

    def cudnn():
        q2, k2 = rope(q, k, cos, sin) if "q_ops" in pieces else (q, k)
        return F.scaled_dot_product_attention(q2, k2, v, is_causal=True, enable_gqa=hq != hkv)

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ms["cudnn"] = triton.testing.do_bench(cudnn, return_mode="median")
    return dict(variant=name, n=n, ms=ms, max_abs_vs_generic=err, ok=all(e <= 2e-2 for e in err.values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--head-dim", type=int, default=64, choices=sorted(SHAPES))
    ap.add_argument("--ns", default="2048,4096,8192,16384")
    ap.add_argument("--schedules", default="", help="labels of SCHEDULES[head dim] to run (default: all)")
    args = ap.parse_args()
    d = args.head_dim
    labels = args.schedules.split(",") if args.schedules else list(SCHEDULES[d])
    if unknown := sorted(set(labels) - set(SCHEDULES[d])):
        ap.error(f"--schedules: {unknown} not among head dim {d}'s {sorted(SCHEDULES[d])}")
    schedules = {label: SCHEDULES[d][label] for label in labels}
    b, hq, hkv, dtype = SHAPES[d]
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp())
    rope = torch.compile(_rope, dynamic=False)
    head = " | ".join(schedules)
    rows, lines = (
        [],
        [
            f"# Head dim {d}: Gluon consumer schedules vs the generic kernel and cuDNN "
            f"(B {b}, Hq {hq}, Hkv {hkv}, {str(dtype).removeprefix('torch.')})",
            "",
            f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}, "
            f"cuDNN {torch.backends.cudnn.version()}",
            "",
            f"| variant | N | generic | {head} | cuDNN (after RoPE) | best / generic | best / cuDNN |",
            "|---|---|---|" + "---|" * len(schedules) + "---|---|---|",
        ],
    )
    for name, pieces in variants(d).items():
        for n in (int(x) for x in args.ns.split(",")):
            row = case(name, pieces, d, n, rope, folder, schedules)
            rows.append(row)
            ms, err = row["ms"], row["max_abs_vs_generic"]
            flops = 4 * b * hq * d * n * (n + 1) / 2
            best = min(schedules, key=lambda s, ms=ms: ms[s])
            cells = [
                f"{ms[key]:.3f} ({flops / ms[key] / 1e9:.0f})" + ("" if err.get(key, 0) <= 2e-2 else " WRONG")
                for key in ("generic", *schedules, "cudnn")
            ]
            lines.append(
                f"| {name} | {n} | "
                + " | ".join(cells)
                + f" | {best}: {ms['generic'] / ms[best]:.2f} | {ms['cudnn'] / ms[best]:.2f} |"
            )
            print(lines[-1], flush=True)
            (args.out / f"consumers_d{d}.json").write_text(json.dumps(rows, indent=1))
            (args.out / f"consumers_d{d}.md").write_text("\n".join(lines) + "\n\nCells: median ms (TFLOP/s).\n")


if __name__ == "__main__":
    main()
