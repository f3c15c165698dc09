import sys
from pathlib import Path
sys.path.insert(0, "/work/main/python_tests")
from kernel_harness import variant
import torch
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
tag, out = sys.argv[1], Path(sys.argv[2])
ROPE = "attn.rope {x} half theta = 500000.0 rotary_dim = {D}"
SHAPES = {"llama": (1, 32, 8, 128, torch.bfloat16), "paper": (4, 12, 12, 64, torch.float16)}
for shape, (b, hq, hkv, d, dtype) in SHAPES.items():
    ir = variant(dtype=dtype, hq=hq, hkv=hkv, d=d, q_ops=[ROPE.replace("{D}", str(d))], k_ops=[ROPE.replace("{D}", str(d))], score_ops=["attn.mask {s} causal"])
    for n in (4096, 16384):
        for form, opts in (("reduce", {}), ("ordered", dict(gluon_dq_reduce=False))):
            src = compile_module(parse_module(ir), sm=90, seq_len=n, direction="bwd", wrt=(0, 1, 2), **opts).source
            (out / f"{shape}_{n}_{form}_{tag}.py").write_text(src)
