"""Context parallelism, `attnfuse.distributed`, on 2 GPUs with NCCL (issue 14, item 3; run on
the lent 2xH200, skipped without CUDA or with fewer than 2 GPUs).

Two processes (torch.multiprocessing, spawn; a free TCP port for the rendezvous) join an NCCL
process group, one GPU each, and run `attnfuse.distributed.attention` on their load-balanced
shards of a bf16 sequence (N 2048, D 128), forward and backward. Each also runs the same
variant on the full sequence on its own GPU (one process, no distribution) and compares the
unsharded output and dq, dk, dv with it, as relative L2 errors (bf16 tolerance 2e-2: both
sides are bf16 kernels; the sharded dk and dv are two ranks' partial sums added in bf16), for

- `rope_causal`: RoPE (theta 10000) + causal, 8 query and 8 kv heads;
- `gqa`: Llama-3-8B's attention: 32 query heads over 8 kv heads, RoPE theta 500000 with
  Llama 3.1's frequency scaling, causal;
- `window`: 8 query heads over 2 kv heads, RoPE, a sliding window of 700 positions (chunks are
  512 long: the window crosses chunk and rank boundaries).

Then each rank calls it with its own RoPE theta (10000 and 20000): an `AttnFuseError` on both,
naming the mismatch (the ranks' agreement check, an all-gather through NCCL).

    python -m pytest -m gpu python_tests/test_distributed_gpu.py -q
"""

from __future__ import annotations

import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

import attnfuse as af

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

WORLD = 2
B, N, D = 1, 2048, 128
TOLERANCE = 2e-2
TIMEOUT_S = 240
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip
CASES: dict[str, dict[str, Any]] = {
    "rope_causal": {"hq": 8, "hkv": 8, "options": {}},
    "gqa": {"hq": 32, "hkv": 8, "options": {"theta": 500000.0, "scaling": LLAMA3}},
    "window": {"hq": 8, "hkv": 2, "options": {"window": 700}},
}


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    return ((x - ref).norm() / ref.norm()).item()


def inputs(case: str, device: torch.device) -> list[torch.Tensor]:
    """The full-sequence q, k, v and output gradient of `case` (bf16), the same on every rank."""
    g = torch.Generator().manual_seed(sorted(CASES).index(case))
    hq, hkv = CASES[case]["hq"], CASES[case]["hkv"]
    shapes = [(B, hq, N, D), (B, hkv, N, D), (B, hkv, N, D), (B, hq, N, D)]
    return [torch.randn(s, generator=g).to(device, torch.bfloat16) for s in shapes]


def full_sequence(case: str, device: torch.device) -> dict[str, torch.Tensor]:
    """The same variant on the full sequence in this one process: output and dq, dk, dv."""
    opts = CASES[case]["options"]
    rope = {k: opts[k] for k in ("theta", "scaling") if k in opts}
    window = opts.get("window")

    @af.variant
    def full(q, k, v):
        q, k = af.rope(q, **rope), af.rope(k, **rope)
        s = af.mask(af.qk(q, k), af.causal if window is None else af.sliding_window(window))
        return af.pv(af.softmax(s), v)

    q, k, v, grad = inputs(case, device)
    for x in (q, k, v):
        x.requires_grad_()
    out = full(q, k, v)
    out.backward(grad)
    assert q.grad is not None and k.grad is not None and v.grad is not None
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank: NCCL on GPU `rank`, every case sharded and on the full sequence; saves the errors."""
    import torch.distributed as dist

    from attnfuse import distributed as cp

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    results: dict[str, Any] = {}
    try:
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
            timeout=timedelta(seconds=120), device_id=device,
        )  # fmt: skip
        for case in CASES:
            q, k, v, grad = (cp.shard(x) for x in inputs(case, device))
            for x in (q, k, v):
                x.requires_grad_()
            out = cp.attention(q, k, v, **CASES[case]["options"])
            (out.float() * grad.float()).sum().backward()  # this rank's share of the loss
            assert q.grad is not None and k.grad is not None and v.grad is not None
            got = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
            got = {name: cp.unshard(x) for name, x in got.items()}
            expected = full_sequence(case, device)
            results[case] = {name: rel_l2(got[name], expected[name]) for name in got}
        x = torch.randn(1, 2, 8, 16, device=device, dtype=torch.bfloat16)
        try:  # the ranks' agreement check, through NCCL on the GPU
            cp.attention(x, x, x, theta=10000.0 * (1 + rank))
            results["theta_mismatch"] = ""
        except af.AttnFuseError as e:
            results["theta_mismatch"] = str(e)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results = {"failure": traceback.format_exc()}
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Spawn the two ranks, wait for them (with a deadline) and load their errors."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    tmp = tmp_path_factory.mktemp("distributed_gpu")
    ctx = mp.start_processes(worker, args=(WORLD, free_port(), str(tmp)), nprocs=WORLD, join=False,
                             start_method="spawn")  # fmt: skip
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD} ranks did not finish within {TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(10)
    results = []
    for r in range(WORLD):
        res = torch.load(tmp / f"rank{r}.pt")
        assert "failure" not in res, f"rank {r} failed:\n{res['failure']}"
        results.append(res)
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_output_and_gradients_equal_the_full_sequence(ranks: list[dict[str, Any]], case: str) -> None:
    for r, res in enumerate(ranks):
        for name, err in res[case].items():
            assert err < TOLERANCE, f"rank {r} {case} {name}: relative L2 error {err:.2e} (tolerance {TOLERANCE})"


def test_a_theta_that_differs_across_the_ranks_is_refused(ranks: list[dict[str, Any]]) -> None:
    for r, res in enumerate(ranks):
        assert "theta: rank 0 has 10000.0, rank 1 has 20000.0" in res["theta_mismatch"], (r, res["theta_mismatch"])
