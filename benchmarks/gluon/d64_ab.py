"""Head dim 64 on the sm90 Gluon forward: which consumer schedule (issue 22, item 1), against the
generic Triton kernel and SDPA cuDNN, in one process.

    python benchmarks/gluon/d64_ab.py --out DIR [--ns 2048,4096,8192,16384]

The paper shape (B 4, H 12, D 64, fp16), plain causal and RoPE + causal. Each variant's module is
compiled once with kernel-path head-dims 64,128,256 and run with the Gluon kernel's consumer
schedule set per row (`_GL_CONSUMERS[64]` of the loaded module: (warpgroups, ping-pong), at every N), and
kernel-path's min-len lowered to 512 so that short N take the Gluon kernel too; the
generic row is the same variant compiled with gluon=false. SDPA cuDNN computes plain causal (for
RoPE + causal: after a RoPE compiled per shape, `dynamic=False`). Every output is checked against
the generic kernel's first (max abs difference <= 2e-2). Medians of `triton.testing.do_bench`.
Writes DIR/d64_ab.md and .json.
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

ROPE = "attn.rope {x} half theta = 10000.0 rotary_dim = 64"
CAUSAL = "attn.mask {s} causal"
VARIANTS = {"causal": dict(score_ops=[CAUSAL]), "rope_causal": dict(q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL])}
SCHEDULES = {"3wg": (3, False), "3wg_pingpong": (3, True), "2wg": (2, False), "2wg_pingpong": (2, True)}


def _rope(q, k, cos, sin):
    return C.rope_half(q, cos, sin), C.rope_half(k, cos, sin)


def case(name: str, pieces: dict, n: int, rope, folder: Path) -> dict:
    """Times (ms) and differences of one variant at length n: the generic kernel, each schedule,
    and cuDNN (after a compiled RoPE for a RoPE variant)."""
    b, h, d, dtype = 4, 12, 64, torch.float16
    ir = variant(dtype=dtype, hq=h, hkv=h, d=d, **pieces)
    g = torch.Generator(device="cuda").manual_seed(n)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
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
    for label, schedule in SCHEDULES.items():
        glu._GL_CONSUMERS[64] = schedule
        glu._GL_CONSUMERS_SHORT.clear()  # this schedule at every N
        glu._GL_BINARIES.clear()
        err[label] = (glu.launch(q, k, v)[0].float() - ref.float()).abs().max().item()
        ms[label] = triton.testing.do_bench(lambda: glu.launch(q, k, v), return_mode="median")
    cos, sin = (t.to(dtype) for t in C.rope_tables(n, d, "cuda"))

    def cudnn():
        q2, k2 = rope(q, k, cos, sin) if "q_ops" in pieces else (q, k)
        return F.scaled_dot_product_attention(q2, k2, v, is_causal=True)

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ms["cudnn"] = triton.testing.do_bench(cudnn, return_mode="median")
    return dict(variant=name, n=n, ms=ms, max_abs_vs_generic=err, ok=all(e <= 2e-2 for e in err.values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ns", default="2048,4096,8192,16384")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp())
    rope = torch.compile(_rope, dynamic=False)
    head = " | ".join(SCHEDULES)
    rows, lines = (
        [],
        [
            "# Head dim 64: Gluon consumer schedules vs the generic kernel and cuDNN (paper shape, fp16)",
            "",
            f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}, "
            f"cuDNN {torch.backends.cudnn.version()}",
            "",
            f"| variant | N | generic | {head} | cuDNN (after RoPE) | best / generic | best / cuDNN |",
            "|---|---|---|" + "---|" * len(SCHEDULES) + "---|---|---|",
        ],
    )
    for name, pieces in VARIANTS.items():
        for n in (int(x) for x in args.ns.split(",")):
            row = case(name, pieces, n, rope, folder)
            rows.append(row)
            ms, err = row["ms"], row["max_abs_vs_generic"]
            flops = 4 * 4 * 12 * 64 * n * (n + 1) / 2
            best = min(SCHEDULES, key=lambda s, ms=ms: ms[s])
            cells = [
                f"{ms[key]:.3f} ({flops / ms[key] / 1e9:.0f})" + ("" if err.get(key, 0) <= 2e-2 else " WRONG")
                for key in ("generic", *SCHEDULES, "cudnn")
            ]
            lines.append(
                f"| {name} | {n} | "
                + " | ".join(cells)
                + f" | {best}: {ms['generic'] / ms[best]:.2f} | {ms['cudnn'] / ms[best]:.2f} |"
            )
            print(lines[-1], flush=True)
            (args.out / "d64_ab.json").write_text(json.dumps(rows, indent=1))
            (args.out / "d64_ab.md").write_text("\n".join(lines) + "\n\nCells: median ms (TFLOP/s).\n")


if __name__ == "__main__":
    main()
