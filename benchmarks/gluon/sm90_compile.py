"""The sm90 Gluon kernels of a variant compiled on the CPU (Triton's compiler, ptxas and cuobjdump
from the Triton wheel; no GPU, no driver): each kernel's registers, spills, shared memory and
SASS instruction counts. This is the check to run before spending GPU time on a kernel change.

    python benchmarks/gluon/sm90_compile.py [--direction fwd|bwd] [--shape llama|paper|gemma2]
        [--variant rope_causal] [--n 4096] [--form reduce|ordered] [--set NAME=VALUE ...] [--out DIR]

The generated module's launch runs on zero CPU tensors with its Gluon kernels replaced by
stand-ins that record their launches (the generic kernels do nothing); each recorded launch is
then compiled for sm 90 as Triton would compile it. --set changes a module constant in the
generated source first, as `backward_ab.py --configs` does (e.g. `--set _GLB_KV_REGS=gl.constexpr(128)`).
--out keeps each kernel's PTX and SASS there. Shapes: backward_ab's, plus Gemma 2 (head dim 256,
forward only); variants: backward_ab's.

Per kernel it prints:
- ptxas's registers at launch (the consumers raise theirs with setmaxnreg) and its bytes of
  spill stores and loads;
- shared memory;
- the SASS's count of HGMMA, LDL/STL (spills in the code), MUFU, BAR and instructions in all;
- the forms of the wgmma operands in the PTX (`reg` A: from registers; `desc`: shared memory).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python_tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from backward_ab import FORWARD_SHAPES as ALL_SHAPES  # noqa: E402
from backward_ab import VARIANTS, substituted  # noqa: E402
from kernel_harness import compile_for_sm90, variant  # noqa: E402

from attnfuse.cache_loader import load_module  # noqa: E402
from attnfuse.compiler import compile_module  # noqa: E402
from attnfuse.ir import parse_module  # noqa: E402

KERNELS = {"fwd": ("attn_fwd_sm90",), "bwd": ("attn_bwd_sm90", "attn_bwd_dq_sm90")}


class _Capture:
    """Stands in for a Gluon kernel: records the arguments of `kernel[grid](...)` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid: tuple):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def captured_launches(source: str, direction: str, shape: str, n: int) -> dict[str, tuple]:
    """{kernel name: (the real kernel, its arguments, keyword arguments)} of one launch."""
    b, hq, hkv, d, dtype = ALL_SHAPES[shape]
    path = Path(tempfile.mkdtemp()) / "sm90_compile.py"
    path.write_text(source, encoding="utf-8")
    module = load_module(path, interpret=False, name=f"attnfuse_sm90_compile_{path.parent.name}")
    names = [name for name in KERNELS[direction] if hasattr(module, name)]
    if not names:
        raise SystemExit(f"the generated {direction} module launches no Gluon kernel (kernel-path chose another)")
    real = {name: getattr(module, name) for name in names}
    captures = {name: _Capture() for name in names}
    for name, capture in captures.items():
        setattr(module, name, capture)
    module._gluon_fits = module._gluon_bwd_fits = lambda *args: True
    module._launch = lambda *args: None  # the generic Triton kernels
    q = torch.zeros(b, hq, n, d, dtype=dtype)
    k, v = torch.zeros(b, hkv, n, d, dtype=dtype), torch.zeros(b, hkv, n, d, dtype=dtype)
    if direction == "fwd":
        module.launch(q, k, v)
    else:
        module.launch(q, k, v, torch.zeros_like(q), torch.zeros(b, hq, n), torch.zeros_like(q))
    return {name: (real[name], *captures[name].calls[0]) for name in names if captures[name].calls}


def report(name: str, kernel, args: tuple, kwargs: dict, out: Path | None) -> str:
    """Compile one launch for sm 90 and describe it (see the module docstring)."""
    binary = compile_for_sm90(kernel, args, kwargs, num_warps=kwargs["num_warps"])
    ptx = binary.asm["ptx"]
    tools = Path(sys.modules["triton"].__file__).parent / "backends" / "nvidia" / "bin"
    scratch = Path(tempfile.mkdtemp())
    (scratch / "k.ptx").write_text(ptx)
    ptxas = subprocess.run(
        [str(tools / "ptxas"), "-arch=sm_90a", "-v", "-o", str(scratch / "k.cubin"), str(scratch / "k.ptx")],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    regs = re.search(r"Used (\d+) registers", ptxas)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas)
    sass = subprocess.run(
        [str(tools / "cuobjdump"), "-sass", str(scratch / "k.cubin")], capture_output=True, text=True, check=True
    ).stdout
    ops = Counter(
        m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]*)", sass)
    )
    forms = Counter(
        f"{m.group(1)} {'reg' if m.group(2) == '{' else 'desc'}"
        for m in re.finditer(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\S*\s+\{[^}]*\},\s*(\{|%rd)", ptx)
    )
    if out is not None:
        (out / f"{name}.ptx").write_text(ptx)
        (out / f"{name}.sass").write_text(sass)
    counts = ", ".join(f"{op} {ops[op]}" for op in ("HGMMA", "LDL", "STL", "MUFU", "BAR"))
    return (
        f"{name}: {regs.group(1) if regs else '?'} registers at launch, spills "
        f"{spills.group(1) if spills else '?'} B stored / {spills.group(2) if spills else '?'} B loaded, "
        f"shared memory {binary.metadata.shared} B\n"
        f"  SASS: {sum(ops.values())} instructions; {counts}\n"
        f"  wgmma A operands: {', '.join(f'{form} x{c}' for form, c in sorted(forms.items()))}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--direction", choices=sorted(KERNELS), default="bwd")
    ap.add_argument("--shape", choices=sorted(ALL_SHAPES), default="llama")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="rope_causal")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--form", choices=("reduce", "ordered"), default="reduce", help="bwd: how dQ is formed")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a module constant's value")
    ap.add_argument("--out", type=Path, help="a folder for each kernel's PTX and SASS")
    args = ap.parse_args()
    b, hq, hkv, d, dtype = ALL_SHAPES[args.shape]
    pieces = {k: [p.replace("{D}", str(d)) for p in v] for k, v in VARIANTS[args.variant].items()}
    ir = variant(dtype=dtype, hq=hq, hkv=hkv, d=d, **pieces)
    options: dict = dict(gluon_head_dims=(64, 128, 256))
    if args.direction == "bwd":
        options.update(direction="bwd", wrt=(0, 1, 2), gluon_dq_reduce=args.form == "reduce")
    source = compile_module(parse_module(ir), sm=90, seq_len=args.n, **options).source
    source = substituted(source, tuple(tuple(s.split("=", 1)) for s in args.set))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    print(f"{args.direction} {args.shape} (B {b}, Hq {hq}, Hkv {hkv}, D {d}) {args.variant} N {args.n}", flush=True)
    for name, (kernel, kargs, kwargs) in captured_launches(source, args.direction, args.shape, args.n).items():
        print(report(name, kernel, kargs, kwargs, args.out), flush=True)


if __name__ == "__main__":
    main()
