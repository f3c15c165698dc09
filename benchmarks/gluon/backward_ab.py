"""The sm90 Gluon backward against the generic Triton backward, same module source otherwise:
each variant's backward compiled twice (kernel-path gluon=true / gluon=false), its generated
`launch` timed alone (delta, pre-rotations, the dK/dV and dQ kernels, the workspaces'
kernels), median of `triton.testing.do_bench`, after a check that both give the same
gradients (relative L2 difference <= 2e-2). The Gluon backward as compiled by default (dQ by TMA
reduce-adds, kernel-path dq-reduce) and with its ordered dQ kernel (dq-reduce=false).

    python benchmarks/gluon/backward_ab.py --out DIR [--ns 4096,16384]

With --configs, the Gluon backward is also timed with its kernels' module constants changed in the
generated source, e.g. `--configs "s3:_GLB_STAGES=3;q64:_GLBQ_SCHEDULE={64:(64,3,False),128:(64,3,False)}"`
(label:NAME=VALUE NAME=VALUE...;..., values without spaces; each config's gradients checked like
the others): the A/B of a kernel schedule before it becomes a default. A config with the word
`+ordered` among its settings builds the ordered dQ form (kernel-path dq-reduce=false) instead.

With --kernels, also the Gluon backward's time per kernel (torch.profiler's CUDA times of 20
launches, per launch) in DIR/backward_kernels.md: which kernel to work on.

Writes DIR/backward_ab.md and .json. TFLOP/s count 2.5x the forward's 4 B Hq D per kept
(query, key) pair: N(N+1)/2 pairs under a causal mask, wN - w(w-1)/2 under a window of w.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_tests"))
from kernel_harness import variant  # noqa: E402

from attnfuse.cache import load_source  # noqa: E402
from attnfuse.compiler import compile_module  # noqa: E402
from attnfuse.ir import parse_module  # noqa: E402

ROPE = "attn.rope {x} half theta = 500000.0 rotary_dim = {D}"
NORM = "attn.norm {x} eps = 1.0e-06"
CAUSAL = "attn.mask {s} causal"
WINDOWS = {"window_softcap": 1024}
"""The variants' window (the others are causal)."""
SHAPES = {"llama": (1, 32, 8, 128, torch.bfloat16), "paper": (4, 12, 12, 64, torch.float16)}
FORWARD_SHAPES = SHAPES | {"gemma2": (1, 16, 8, 256, torch.bfloat16)}
"""The shapes (batch, Hq, Hkv, head dim, dtype) of the A/B tools; Gemma 2's (head dim 256) forward only."""
VARIANTS = {
    "causal": dict(score_ops=[CAUSAL]),
    "rope_causal": dict(q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL]),
    "qknorm_rope": dict(q_ops=[NORM, ROPE], k_ops=[NORM, ROPE], score_ops=[CAUSAL]),
    "window_softcap": dict(score_ops=["attn.softcap {s} cap = 50.0", "attn.mask {s} sliding_window(1024)"]),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ns", default="4096,16384")
    ap.add_argument("--shapes", default="llama,paper")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--kernels", action="store_true", help="also time the Gluon backward's kernels one by one")
    ap.add_argument(
        "--configs", default="", help="label:NAME=VALUE NAME=VALUE [+reduce];... module constants to change (Gluon)"
    )
    ap.add_argument("--no-ordered", action="store_true", help="leave out the ordered dQ kernel")
    args = ap.parse_args()
    configs = parse_configs(args.configs)
    ordered = dict(gluon_dq_reduce=False)
    builds = [("generic", dict(gluon=False), ()), ("gluon", {}, ())]
    builds += [] if args.no_ordered else [("ordered", ordered, ())]
    builds += [
        (label, ordered if ("+ordered",) in subs else {}, tuple(x for x in subs if x != ("+ordered",)))
        for label, subs in configs.items()
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp())
    rows = []
    lines = [
        "# Gluon backward vs generic backward (the generated launch alone)",
        "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}",
        "",
        "| shape | variant | N | generic ms (TFLOP/s) | Gluon ms (TFLOP/s) | "
        + "".join(f"{label} ms (TFLOP/s) | " for label, _, _ in builds[2:])
        + "Gluon / generic |",
        "|---|---|---|---|---|---|" + "---|" * len(builds[2:]),
    ]
    kernel_lines = [
        "# The Gluon backward's kernels (CUDA time per launch, torch.profiler, 20 launches)",
        "",
        "| shape | variant | N | build | kernels (µs) |",
        "|---|---|---|---|---|",
    ]
    for shape in args.shapes.split(","):
        b, hq, hkv, d, dtype = SHAPES[shape]
        for name in args.variants.split(","):
            pieces = {k: [p.replace("{D}", str(d)) for p in v] for k, v in VARIANTS[name].items()}
            ir = variant(dtype=dtype, hq=hq, hkv=hkv, d=d, **pieces)
            for n in (int(x) for x in args.ns.split(",")):
                q, k, v, out, lse, dout = backward_inputs(ir, shape, n, folder)
                times, grads = {}, {}
                for label, opts, subs in builds:
                    src = compile_module(
                        parse_module(ir), sm=90, seq_len=n, direction="bwd", wrt=(0, 1, 2), **opts
                    ).source
                    src = substituted(src, subs)
                    assert ("_gluon_backward(" in src) is (label != "generic"), label
                    bwd = load_source(src, folder, interpret=False)
                    grads[label] = bwd.launch(q, k, v, out, lse, dout)
                    call = (q, k, v, out, lse, dout)
                    times[label] = triton.testing.do_bench(
                        lambda bwd=bwd, call=call: bwd.launch(*call), return_mode="median"
                    )
                    if args.kernels and label not in ("generic", "ordered"):
                        kernel_lines.append(f"| {shape} | {name} | {n} | {label} | {kernel_times(bwd, call)} |")
                        (args.out / "backward_kernels.md").write_text("\n".join(kernel_lines) + "\n")
                errs = [
                    ((a.double() - r.double()).norm() / r.double().norm()).item()
                    for label, _, _ in builds[1:]
                    for a, r in zip(grads[label], grads["generic"], strict=True)
                ]
                w = WINDOWS.get(name)
                pairs = n * (n + 1) / 2 if w is None else w * n - w * (w - 1) / 2
                flops = 2.5 * 4 * b * hq * d * pairs
                tf = {k2: flops / (t * 1e-3) / 1e12 for k2, t in times.items()}
                ok = max(errs) <= 2e-2
                rows.append(dict(shape=shape, variant=name, n=n, ms=times, tflops=tf, max_rel_diff=max(errs), ok=ok))
                ratio = times["generic"] / times["gluon"]
                lines.append(
                    f"| {shape} | {name} | {n} | {times['generic']:.3f} ({tf['generic']:.0f}) | "
                    f"{times['gluon']:.3f} ({tf['gluon']:.0f}) | "
                    + "".join(f"{times[label]:.3f} ({tf[label]:.0f}) | " for label, _, _ in builds[2:])
                    + f"{ratio:.2f}{'' if ok else ' WRONG'} |"
                )
                print(lines[-1], flush=True)
                (args.out / "backward_ab.json").write_text(json.dumps(rows, indent=1))
                (args.out / "backward_ab.md").write_text("\n".join(lines) + "\n")


def backward_inputs(ir: str, shape: str, n: int, folder: Path) -> tuple[torch.Tensor, ...]:
    """A generated backward launch's arguments for variant `ir` at `shape` and length n: random
    q, k, v (seeded by n), the forward's out and lse (its generated launch), and a random dout."""
    b, hq, hkv, d, dtype = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    fwd = load_source(compile_module(parse_module(ir), sm=90, seq_len=n).source, folder, interpret=False)
    out, lse = fwd.launch(q, k, v)
    return q, k, v, out, lse, torch.randn_like(out)


def parse_configs(text: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """`label:NAME=VALUE NAME=VALUE...;...` -> {label: ((NAME, VALUE), ...)}."""
    configs = {}
    for item in filter(None, (x.strip() for x in text.split(";"))):
        label, _, sets = item.partition(":")
        configs[label] = tuple(tuple(x.split("=", 1)) for x in sets.split())
    return configs


def substituted(src: str, subs) -> str:
    """The generated source with each module constant NAME (a line `NAME = ...`) set to VALUE."""
    for name, value in subs:
        src, count = re.subn(rf"^({re.escape(name)} = )[^#\n]*?(\s*(#.*)?)$", rf"\g<1>{value}\g<2>", src, flags=re.M)
        if count != 1:
            raise SystemExit(f"--configs: {name} is not a module constant of the generated source")
    return src


def kernel_times(bwd, call, launches: int = 20) -> str:
    """Each CUDA kernel's time per launch of `bwd.launch(*call)`, longest first, in µs."""
    from torch.profiler import ProfilerActivity, profile

    bwd.launch(*call)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(launches):
            bwd.launch(*call)
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and ev.device_time_total > 0:
            totals[ev.key] = totals.get(ev.key, 0.0) + ev.device_time_total / launches
    return ", ".join(f"{k[:40]} {t:.0f}" for k, t in sorted(totals.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    main()
