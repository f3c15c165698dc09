"""Old (0e9574c: rotate_k + k_rot) vs new (K rotated in the dK/dV kernel) backward launch, same process, interleaved."""
import json, sys, tempfile
from pathlib import Path
import torch, triton
sys.path.insert(0, "benchmarks/gluon"); sys.path.insert(0, "python_tests")
from backward_ab import backward_inputs, kernel_times, SHAPES, ROPE, CAUSAL
from kernel_harness import variant
from attnfuse.cache import load_source
out = Path(sys.argv[1]); folder = Path(tempfile.mkdtemp()); here = Path("abwork")
lines = ["| shape | N | form | old ms | new ms | old/new (round 1, 2) | max rel diff |", "|---|---|---|---|---|---|---|"]
for shape in ("llama", "paper"):
    b, hq, hkv, d, dtype = SHAPES[shape]
    ir = variant(dtype=dtype, hq=hq, hkv=hkv, d=d, q_ops=[ROPE.replace("{D}", str(d))], k_ops=[ROPE.replace("{D}", str(d))], score_ops=[CAUSAL])
    for n in (4096, 16384):
        call = backward_inputs(ir, shape, n, folder)
        for form in ("reduce", "ordered"):
            mods = {t: load_source((here / f"{shape}_{n}_{form}_{t}.py").read_text(), folder, interpret=False) for t in ("old", "new")}
            g = {t: m.launch(*call) for t, m in mods.items()}
            diff = max(((a.double() - r.double()).norm() / r.double().norm()).item() for a, r in zip(g["new"], g["old"]))
            ts = {"old": [], "new": []}
            for _ in range(2):
                for t in ("old", "new"):
                    ts[t].append(triton.testing.do_bench(lambda m=mods[t]: m.launch(*call), return_mode="median"))
            r = [o / nw for o, nw in zip(ts["old"], ts["new"])]
            diff = f"{diff:.1e}" + ("" if diff <= 2e-2 else " WRONG")
            lines.append(f"| {shape} | {n} | {form} | {min(ts['old']):.3f} | {min(ts['new']):.3f} | {r[0]:.3f}, {r[1]:.3f} | {diff} |")
            print(lines[-1], flush=True)
            (out / "k_prologue_ab.md").write_text("\n".join(lines) + "\n")
            if form == "reduce":
                with open(out / "kernels.md", "a") as f:
                    for t in ("old", "new"):
                        f.write(f"| {shape} | {n} | {t} | {kernel_times(mods[t], call)} |\n")
