"""`attnfuse-demo`: the main job. Compiles the bundled Llama-3 variant (RoPE with llama3
scaling, causal, GQA) to one fused Triton kernel, runs it — on the GPU when there is one,
else under the Triton interpreter on CPU — and checks it against the reference executor;
then differentiates it through the backward kernels the compiler derives and checks the
gradients against the reference's autograd.

It prints the backend it ran: `triton` on a GPU, else `interpret` (the generated Triton code
under Triton's interpreter). Outside `af.backend(...)`, CPU tensors would run on the eager
`reference` backend (the default, "auto"), which does not exercise the compiler."""

from __future__ import annotations

import sys
import time

import torch

import attnfuse as af
from attnfuse import variants

BACKENDS = {
    "triton": "triton (the compiled kernels on the GPU)",
    "interpret": "interpret (no GPU: the compiled kernels under the Triton interpreter; without "
    'af.backend("interpret"), CPU tensors run on the eager reference backend, which does not compile)',
}
"""What the demo prints for the backend it runs."""


def main() -> int:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float16)
    # Llama-3-8B heads (32 query, 8 kv, head dim 128); a short sequence on CPU, where the
    # interpreter runs every program in Python.
    b, n = (1, 4096) if cuda else (1, 96)
    torch.manual_seed(0)
    q = torch.randn(b, 32, n, 128, device=device, dtype=dtype)
    k = torch.randn(b, 8, n, 128, device=device, dtype=dtype)
    v = torch.randn(b, 8, n, 128, device=device, dtype=dtype)
    backend = "triton" if cuda else "interpret"
    print(f"AttnFuse {af.__version__}: Llama-3 RoPE+causal, q {list(q.shape)} {dtype}")
    print(f"backend: {BACKENDS[backend]}")
    print(variants.llama3.ir(q, k, v))
    with af.backend(backend):
        kernel = variants.llama3.compile(q, k, v)
        t0 = time.perf_counter()
        out = kernel(q, k, v)
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    with af.backend("reference"):
        ref = variants.llama3(q.cpu(), k.cpu(), v.cpu())
    err = (out.float().cpu() - ref.float()).abs().max().item()
    print(f"kernel source: {kernel.path}")
    print(f"launch: {kernel.launch_params}")
    print(f"max |out - reference| = {err:.2e}   (first call, compile included: {elapsed:.2f} s)")
    tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
    if not err <= tol:
        print(f"FAILED: error above {tol}", file=sys.stderr)
        return 1
    # Training: the same call with inputs that require grad runs the derived backward.
    xs = [t.detach().requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(out)
    with af.backend(backend):
        t0 = time.perf_counter()
        grads = torch.autograd.grad(variants.llama3(*xs), xs, dout)
        elapsed = time.perf_counter() - t0
    refs_in = [t.detach().cpu().float().requires_grad_() for t in (q, k, v)]
    with af.backend("reference"):
        refs = torch.autograd.grad(variants.llama3(*refs_in), refs_in, dout.cpu().float())
    rel = max(((g.float().cpu() - r).norm() / r.norm()).item() for g, r in zip(grads, refs, strict=True))
    print(f"gradients dq, dk, dv: max relative L2 error {rel:.2e}   (backward compiled and run: {elapsed:.2f} s)")
    if not rel <= (3e-2 if dtype == torch.bfloat16 else 6e-3):
        print("FAILED: gradient error above tolerance", file=sys.stderr)
        return 1
    print(f"OK (backend {backend}; checked against the reference backend)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
