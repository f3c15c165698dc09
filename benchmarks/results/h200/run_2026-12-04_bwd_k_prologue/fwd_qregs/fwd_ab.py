"""The Gluon forward with Q in registers (the register operand of S = Q K^T) against Q from shared memory,
same process, interleaved rounds; cuDNN for reference. Paper shape (D 64) and Llama-3-8B (D 128), causal."""

import json
import re
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, "python_tests")
from kernel_harness import variant

from attnfuse.cache import load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module

out = Path(sys.argv[1])
folder = Path(tempfile.mkdtemp())
SHAPES = {64: (4, 12, 12, torch.float16), 128: (1, 32, 8, torch.bfloat16)}
BUILDS = {
    64: {"3wg": ((3, False), 0), "3wg_q": ((3, False), 64), "2wg_q": ((2, False), 64)},
    128: {"2wg_pp": ((2, True), 0), "2wg_pp_q": ((2, True), 128)},
}
lines = ["| D | N | " + " | ".join("build: ms (TFLOP/s)" for _ in range(1)) + " | cuDNN ms |", "|---|---|---|---|"]
rows = []
for d, (b, hq, hkv, dtype) in SHAPES.items():
    ir = variant(dtype=dtype, hq=hq, hkv=hkv, d=d, score_ops=["attn.mask {s} causal"])
    for n in (4096, 16384):
        g = torch.Generator(device="cuda").manual_seed(n)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype, generator=g)
        k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
        src = compile_module(parse_module(ir), sm=90, seq_len=n).source
        mods, ref = {}, None
        for label, (sched, qregs) in BUILDS[d].items():
            s2, c = re.subn(
                r"^_GL_Q_REGS = gl.constexpr\(\d+\)", f"_GL_Q_REGS = gl.constexpr({qregs})", src, flags=re.M
            )
            assert c == 1
            m = load_source(s2 + f"\n# {label}\n", folder, interpret=False)
            m._GL_CONSUMERS[d] = sched
            m._GL_CONSUMERS_SHORT.clear()
            o = m.launch(q, k, v)[0]
            ref = o if ref is None else ref
            err = (o.float() - ref.float()).abs().max().item()
            mods[label] = (m, err)
        ts = {label: [] for label in mods}
        for _ in range(2):
            for label, (m, _) in mods.items():
                ts[label].append(
                    triton.testing.do_bench(lambda m=m, q=q, k=k, v=v: m.launch(q, k, v), return_mode="median")
                )
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            cud = triton.testing.do_bench(
                lambda q=q, k=k, v=v, gqa=hq != hkv: F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=gqa
                ),
                return_mode="median",
            )
        flops = 4 * b * hq * d * n * (n + 1) / 2
        cells = [
            f"{label}: {min(t):.3f} ({flops / min(t) / 1e9:.0f}; "
            f"rounds {t[0]:.3f}/{t[1]:.3f}; err {mods[label][1]:.1e})"
            for label, t in ts.items()
        ]
        lines.append(f"| {d} | {n} | " + "; ".join(cells) + f" | {cud:.3f} |")
        rows.append(dict(d=d, n=n, ms=ts, cudnn=cud, err={k2: v2[1] for k2, v2 in mods.items()}))
        print(lines[-1], flush=True)
        (out / "fwd_qregs.md").write_text("\n".join(lines) + "\n")
        (out / "fwd_qregs.json").write_text(json.dumps(rows, indent=1))
