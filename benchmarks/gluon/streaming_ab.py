"""The backward's streaming kernels (K's and Q's pre-rotations `rotate_k` / `rotate_q`, delta's
`attn_bwd_pre`) at other launch shapes: rows per program and warps, set per label through
`prerotate_to_tl.PREROTATE` and `backward_pre_to_tl.PRE` before compiling. Each label's backward
(RoPE + causal, the Gluon path) is checked against the first label's gradients (relative L2
difference <= 1e-3), then each kernel's CUDA time per launch (torch.profiler, 20 launches) and
the whole launch's (do_bench median) are reported.

    python benchmarks/gluon/streaming_ab.py --out DIR [--ns 4096] [--shapes llama,paper]
        [--configs "r64w4:64,4;r128w8:128,8"]    # label:rows,warps (both kernels)

Writes DIR/streaming_ab.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from backward_ab import SHAPES, backward_inputs, kernel_times  # noqa: E402
from kernel_harness import variant  # noqa: E402

from attnfuse.cache import load_source  # noqa: E402
from attnfuse.compiler import compile_module  # noqa: E402
from attnfuse.ir import parse_module  # noqa: E402
from attnfuse.passes import backward_pre_to_tl, prerotate_to_tl  # noqa: E402

ROPE = "attn.rope {x} half theta = 500000.0 rotary_dim = {D}"
DEFAULT = "r64w4:64,4;r64w8:64,8;r128w8:128,8;r128w16:128,16;r32w4:32,4"


def parse(text: str) -> dict[str, tuple[int, int]]:
    """`label:rows,warps;...` -> {label: (rows, warps)}."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(";"))):
        label, _, shape = item.partition(":")
        rows, warps = (int(x) for x in shape.split(","))
        out[label] = (rows, warps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ns", default="4096")
    ap.add_argument("--shapes", default="llama,paper")
    ap.add_argument("--configs", default=DEFAULT)
    args = ap.parse_args()
    configs = parse(args.configs)
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp())
    lines = [
        "# The backward's streaming kernels at other launch shapes (RoPE + causal, Gluon path)",
        "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}",
        "",
        "| shape | N | label (rows, warps) | launch ms | rotate_q µs | rotate_k µs | attn_bwd_pre µs | all kernels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for shape in args.shapes.split(","):
        b, hq, hkv, d, dtype = SHAPES[shape]
        rope = ROPE.replace("{D}", str(d))
        ir = variant(dtype=dtype, hq=hq, hkv=hkv, d=d, q_ops=[rope], k_ops=[rope], score_ops=["attn.mask {s} causal"])
        for n in (int(x) for x in args.ns.split(",")):
            call = backward_inputs(ir, shape, n, folder)
            first = None
            for label, (block, warps) in configs.items():
                prerotate_to_tl.PREROTATE = prerotate_to_tl.PrerotateConfig(block_n=block, num_warps=warps)
                backward_pre_to_tl.PRE = backward_pre_to_tl.PreConfig(block=block, num_warps=warps)
                src = compile_module(parse_module(ir), sm=90, seq_len=n, direction="bwd", wrt=(0, 1, 2)).source
                bwd = load_source(src, folder, interpret=False)
                grads = bwd.launch(*call)
                if first is None:
                    first = [x.double() for x in grads]
                err = max(((a.double() - r).norm() / r.norm()).item() for a, r in zip(grads, first, strict=True))
                ms = triton.testing.do_bench(lambda bwd=bwd, call=call: bwd.launch(*call), return_mode="median")
                times = kernel_times(bwd, call)
                per = dict(x.rsplit(" ", 1) for x in times.split(", "))
                cells = [per.get(kname, "-") for kname in ("rotate_q", "rotate_k", "attn_bwd_pre")]
                ok = err <= 1e-3
                rows.append(dict(shape=shape, n=n, label=label, rows=block, warps=warps, ms=ms, kernels=per, err=err))
                lines.append(
                    f"| {shape} | {n} | {label} ({block}, {warps}) | {ms:.3f}{'' if ok else ' WRONG'} | "
                    + " | ".join(cells)
                    + f" | {times} |"
                )
                print(lines[-1], flush=True)
                (args.out / "streaming_ab.md").write_text("\n".join(lines) + "\n")
                (args.out / "streaming_ab.json").write_text(json.dumps(rows, indent=1))
    prerotate_to_tl.PREROTATE = prerotate_to_tl.PrerotateConfig()
    backward_pre_to_tl.PRE = backward_pre_to_tl.PreConfig()


if __name__ == "__main__":
    main()
