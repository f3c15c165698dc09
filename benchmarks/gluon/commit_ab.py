"""Two commits' generated modules timed in one process: the A/B of a change that module constants
cannot express (a kernel's structure, its launcher), which `backward_ab.py --configs` and
`consumers_ab.py` cannot build.

    # where git is (the GPU machine gets the working tree, not the history):
    python benchmarks/gluon/commit_ab.py generate --base REV --dir DIR [--direction bwd|fwd]
        [--shapes llama,paper] [--variants rope_causal] [--ns 4096,16384] [--forms reduce,ordered]
    # on the GPU (DIR, inside the working tree and not ignored by git, travels with it):
    python benchmarks/gluon/commit_ab.py run --dir DIR --out OUT [--kernels]

`generate` compiles every case twice: with commit REV's compiler (a temporary git worktree,
in a subprocess that imports AttnFuse from it) and with the working tree's. The editable
install maps `attnfuse.passes` and `attnfuse.dialects` to the working tree whatever PYTHONPATH
says, through a finder that Python consults after the path. So the worktree's `attnfuse`
package gets links to its own `passes` and `dialects`, and the subprocess checks where its
modules came from. DIR receives one source per (build, case) and manifest.json.

`run` loads each case's two modules, gives them the same inputs (backward: the forward's out
and lse and a random dout, `backward_ab.backward_inputs`), checks that their results agree
(relative L2 difference <= 2e-2), then times them in two interleaved rounds (medians of
`triton.testing.do_bench`). With --kernels it also times each build's kernels
(`backward_ab.kernel_times`). It writes OUT/commit_ab.md and .json. Shapes and variants are
backward_ab's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python_tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
BUILDS = ("base", "head")


def cases(args: argparse.Namespace) -> list[dict]:
    """The cases of the command line: shape, variant, N, form (bwd: reduce or ordered dQ; fwd)."""
    forms = args.forms.split(",") if args.direction == "bwd" else ["fwd"]
    if args.direction == "bwd" and "gemma2" in args.shapes.split(","):
        raise SystemExit("commit_ab: gemma2 (head dim 256) has no Gluon backward; use it with --direction fwd")
    return [
        dict(shape=s, variant=v, n=int(n), form=f)
        for s in args.shapes.split(",")
        for v in args.variants.split(",")
        for n in args.ns.split(",")
        for f in forms
    ]


def case_ir(case: dict) -> str:
    from backward_ab import FORWARD_SHAPES, VARIANTS
    from kernel_harness import variant

    _, hq, hkv, d, dtype = FORWARD_SHAPES[case["shape"]]
    pieces = {k: [p.replace("{D}", str(d)) for p in v] for k, v in VARIANTS[case["variant"]].items()}
    return variant(dtype=dtype, hq=hq, hkv=hkv, d=d, **pieces)


def case_file(build: str, case: dict) -> str:
    return f"{build}__{case['shape']}__{case['variant']}__{case['n']}__{case['form']}.py"


def compile_cases(build: str, folder: Path, todo: list[dict]) -> None:
    """Each case's generated module, by the AttnFuse this process imports, into `folder`."""
    import attnfuse
    from attnfuse.compiler import compile_module
    from attnfuse.ir import parse_module

    print(f"{build}: AttnFuse from {Path(attnfuse.__file__).parent}", flush=True)
    for case in todo:
        options = {} if case["form"] != "ordered" else dict(gluon_dq_reduce=False)
        if case["form"] != "fwd":
            options.update(direction="bwd", wrt=(0, 1, 2))
        source = compile_module(parse_module(case_ir(case)), sm=90, seq_len=case["n"], **options).source
        (folder / case_file(build, case)).write_text(source, encoding="utf-8")


def generate(args: argparse.Namespace) -> None:
    folder = args.dir.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    todo = cases(args)
    (folder / "manifest.json").write_text(json.dumps(dict(base=args.base, cases=todo), indent=1))
    compile_cases("head", folder, todo)
    tree = Path(tempfile.mkdtemp(prefix="attnfuse_base_")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), args.base], check=True)
    try:
        for sub in ("passes", "dialects"):  # laid out as installed (setup.cfg's package_dir)
            (tree / "attnfuse" / sub).symlink_to(tree / sub, target_is_directory=True)
        env = dict(os.environ, PYTHONPATH=str(tree))
        subprocess.run(
            [sys.executable, __file__, "_compile", "--dir", str(folder), "--base-tree", str(tree)], env=env, check=True
        )
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)
    same = sum(
        (folder / case_file("base", c)).read_bytes() == (folder / case_file("head", c)).read_bytes() for c in todo
    )
    print(f"{len(todo) - same} of {len(todo)} cases compile differently at {args.base} and in the working tree")


def compile_base(args: argparse.Namespace) -> None:
    """The subprocess of `generate`: the base commit's compiler, checked to be the worktree's."""
    import attnfuse.passes

    for module in (sys.modules["attnfuse"], attnfuse.passes):
        where = Path(module.__file__ or "").resolve()
        if not where.is_relative_to(args.base_tree.resolve()):
            raise SystemExit(f"{module.__name__} imported from {where}, not from the base worktree")
    manifest = json.loads((args.dir / "manifest.json").read_text())
    compile_cases("base", args.dir, manifest["cases"])


def relative_difference(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def run(args: argparse.Namespace) -> None:
    import torch
    import triton
    from backward_ab import FORWARD_SHAPES, backward_inputs, kernel_times

    from attnfuse.cache import load_source

    manifest = json.loads((args.dir / "manifest.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp())
    lines = [
        f"# Commit {manifest['base']} (base) against the working tree (head): the generated launch",
        "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}",
        "",
        "| shape | variant | N | form | base ms | head ms | base / head, rounds 1 and 2 | max rel diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    kernel_lines, rows = [], []
    for case in manifest["cases"]:
        ir = case_ir(case)
        b, hq, hkv, d, dtype = FORWARD_SHAPES[case["shape"]]
        n = case["n"]
        if case["form"] == "fwd":
            g = torch.Generator(device="cuda").manual_seed(n)
            call = tuple(torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) for h in (hq, hkv, hkv))
        else:
            call = backward_inputs(ir, case["shape"], n, scratch)
        mods = {
            build: load_source((args.dir / case_file(build, case)).read_text(), scratch, interpret=False)
            for build in BUILDS
        }
        results = {build: mod.launch(*call) for build, mod in mods.items()}
        diff = max(relative_difference(h, b_) for h, b_ in zip(results["head"], results["base"], strict=True))
        times: dict[str, list[float]] = {build: [] for build in BUILDS}
        for _ in range(2):
            for build, mod in mods.items():
                times[build].append(
                    triton.testing.do_bench(lambda mod=mod, call=call: mod.launch(*call), return_mode="median")
                )
        ratios = [base / head for base, head in zip(times["base"], times["head"], strict=True)]
        mark = "" if diff <= 2e-2 else " WRONG"
        lines.append(
            f"| {case['shape']} | {case['variant']} | {n} | {case['form']} | {min(times['base']):.3f} | "
            f"{min(times['head']):.3f} | {ratios[0]:.3f}, {ratios[1]:.3f} | {diff:.1e}{mark} |"
        )
        print(lines[-1], flush=True)
        rows.append(dict(case, ms=times, max_rel_diff=diff))
        if args.kernels:
            for build, mod in mods.items():
                kernel_lines.append(
                    f"| {case['shape']} | {case['variant']} | {n} | {case['form']} | {build} | "
                    f"{kernel_times(mod, call)} |"
                )
        text = "\n".join(lines) + "\n"
        if kernel_lines:
            text += "\nKernels (µs per launch, torch.profiler):\n\n| shape | variant | N | form | build | kernels |\n"
            text += "|---|---|---|---|---|---|\n" + "\n".join(kernel_lines) + "\n"
        (args.out / "commit_ab.md").write_text(text)
        (args.out / "commit_ab.json").write_text(json.dumps(dict(base=manifest["base"], rows=rows), indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="compile every case with commit --base and with the working tree")
    gen.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    gen.add_argument("--dir", type=Path, required=True, help="where the sources and manifest.json go")
    gen.add_argument("--direction", choices=("bwd", "fwd"), default="bwd")
    gen.add_argument("--shapes", default="llama,paper", help="llama, paper; gemma2 (head dim 256): fwd only")
    gen.add_argument("--variants", default="rope_causal")
    gen.add_argument("--ns", default="4096,16384")
    gen.add_argument("--forms", default="reduce", help="bwd: reduce (dQ by reduce-adds, the default), ordered")
    base = sub.add_parser("_compile")  # generate's subprocess
    base.add_argument("--dir", type=Path, required=True)
    base.add_argument("--base-tree", type=Path, required=True)
    timing = sub.add_parser("run", help="time the two builds of every case on the GPU")
    timing.add_argument("--dir", type=Path, required=True)
    timing.add_argument("--out", type=Path, required=True)
    timing.add_argument("--kernels", action="store_true", help="also each build's kernels (torch.profiler)")
    args = ap.parse_args()
    {"generate": generate, "_compile": compile_base, "run": run}[args.command](args)


if __name__ == "__main__":
    main()
