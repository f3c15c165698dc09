"""Context parallelism, `attnfuse.distributed` (issue 14, items 2 and 3), on CPU.

Two processes (this file run as a script, `python test_distributed.py RANK WORLD INIT OUT`)
join a gloo process group and run `attnfuse.distributed.attention` on their load-balanced
shards under the interpreter (TRITON_INTERPRET=1, fp32, B 1, N 32, D 16), forward and
backward. Each saves its unsharded output and unsharded dq, dk, dv; the test process computes
the same full-sequence variant (af.rope + af.causal or af.sliding_window) in one process and
requires both ranks' results within 1e-4 relative L2, for

- `rope_causal`: RoPE + causal, 4 query and 4 kv heads;
- `gqa`: 4 query heads over 2 kv heads, RoPE with theta 500000, interleaved pairs on 8 of
  the 16 channels and an explicit qk scale;
- `window`: GQA with a sliding window of 6 positions (across the chunks' boundaries: chunks
  are 8 long).

The children also check `shard`/`unshard`/`positions` and the `AttnFuseError`s the module
raises (sequence not divisible by 2W, odd local length, q and k of different lengths, sinks,
document masks, a bad window); no process group at all is checked here. Then, on a second
gloo group with a 20 s timeout, they call `attention` with arguments that differ across the
ranks (RoPE theta or scaling, local length, dtype, batch, K/V requiring grad on one rank only,
one rank's own arguments refused, the traced IR): each must be an `AttnFuseError` on both
ranks naming the mismatch, raised before any other communication (no hang, no gloo error),
and the group must still run an agreed call afterwards. The children are
started once per module and time out (process group, join) instead of hanging.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import torch

import attnfuse as af

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

from attnfuse import distributed as cp  # noqa: E402 - after the skip: it imports torch.distributed

WORLD = 2
TOLERANCE = 1e-4
CHILD_TIMEOUT_S = 240
CASES: dict[str, dict[str, Any]] = {
    "rope_causal": {"hkv": 4, "options": {}},
    "gqa": {"hkv": 2, "options": {"theta": 500000.0, "style": "interleaved", "rotary_dim": 8, "scale": 0.3}},
    "window": {"hkv": 2, "options": {"window": 6}},
}
B, HQ, N, D = 1, 4, 32, 16

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64."""
    x, ref = x.detach().double(), ref.detach().double()
    return ((x - ref).norm() / ref.norm()).item()


def inputs(case: str) -> tuple[torch.Tensor, ...]:
    """The full-sequence q, k, v and output gradient of `case`, the same in every process."""
    gen = torch.Generator().manual_seed(sorted(CASES).index(case))
    hkv = CASES[case]["hkv"]
    shapes = [(B, HQ, N, D), (B, hkv, N, D), (B, hkv, N, D), (B, HQ, N, D)]
    return tuple(torch.randn(s, generator=gen) for s in shapes)


def full_sequence(case: str) -> dict[str, torch.Tensor]:
    """`case`'s output and dq, dk, dv from the full-sequence variant in this one process."""
    opts = CASES[case]["options"]
    rope = {k: opts[k] for k in ("theta", "style", "rotary_dim") if k in opts}
    window = opts.get("window")

    @af.variant
    def full(q, k, v):
        q, k = af.rope(q, **rope), af.rope(k, **rope)
        s = af.mask(af.qk(q, k, scale=opts.get("scale")), af.causal if window is None else af.sliding_window(window))
        return af.pv(af.softmax(s), v)

    q, k, v, grad = inputs(case)
    for x in (q, k, v):
        x.requires_grad_()
    with af.backend("interpret"):
        out = full(q, k, v)
        out.backward(grad)
    assert q.grad is not None and k.grad is not None and v.grad is not None
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


# --------------------------------------------------------------------------- the children


def sharded(case: str, group: Any) -> dict[str, torch.Tensor]:
    """`case` through `cp.attention` on this rank's shards; the unsharded output and grads."""
    q, k, v, grad = (cp.shard(x, group) for x in inputs(case))
    for x in (q, k, v):
        x.requires_grad_()
    with af.backend("interpret"):
        out = cp.attention(q, k, v, group, **CASES[case]["options"])
        (out * grad).sum().backward()  # this rank's share of the loss; the ranks' shares sum to the full one
    grads = {"dq": q.grad, "dk": k.grad, "dv": v.grad}
    with torch.no_grad():
        return {"out": cp.unshard(out, group), **{n: cp.unshard(g, group) for n, g in grads.items() if g is not None}}


def error_message(fn: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the AttnFuseError that fn(*args, **kwargs) raises ("" if none)."""
    try:
        fn(*args, **kwargs)
    except af.AttnFuseError as e:
        return str(e)
    return ""


def errors(group: Any) -> dict[str, str]:
    """The messages of the module's refusals (all raised before any collective)."""
    x = torch.randn(1, 2, 8, 16)
    odd = torch.randn(1, 2, 7, 16)
    return {
        "shard_30": error_message(cp.shard, torch.randn(1, 2, 30, 16), group),
        "positions_30": error_message(cp.positions, 30, group),
        "odd_local": error_message(cp.attention, odd, odd, odd, group),
        "kv_cache": error_message(cp.attention, x, torch.randn(1, 2, 16, 16), torch.randn(1, 2, 16, 16), group),
        "sink": error_message(cp.attention, x, x, x, group, sink=torch.zeros(2)),
        "document": error_message(cp.attention, x, x, x, group, document=torch.zeros(1, 16, dtype=torch.int64)),
        "window": error_message(cp.attention, x, x, x, group, window=0),
    }


def layout(group: Any) -> dict[str, Any]:
    """This rank's shard and positions of arange(16), and the round trip through unshard."""
    x = torch.arange(16).view(1, 1, 16, 1)
    mine = cp.shard(x, group)
    return {
        "shard": mine.flatten().tolist(),
        "positions": cp.positions(16, group).tolist(),
        "round_trip": torch.equal(cp.unshard(mine, group), x),
        "dim_1": cp.unshard(cp.shard(x.view(1, 16), group, dim=1), group, dim=1).flatten().tolist(),
    }


def mismatches(rank: int, group: Any) -> dict[str, str]:
    """The messages of `cp.attention` called differently on the ranks (rank r's arguments here),
    on `group`, which has a short timeout: a missed mismatch fails within seconds, not hangs."""
    x = torch.randn(1, 2, 8, 16)
    longer = torch.randn(1, 2, 8 + 8 * rank, 16)  # local length 8 on rank 0, 16 on rank 1
    half = x.to(torch.float16 if rank else torch.float32)
    batch = torch.randn(1 + rank, 2, 8, 16)
    odd = torch.randn(1, 2, 8 - rank, 16)  # rank 1 refuses its own arguments
    kv = x.clone().requires_grad_(rank == 0)  # rank 0 would wait in the backward's reduce-scatter
    scaling = af.linear_scaling(2.0) if rank else None
    with patch.object(cp, "_ir_digest", lambda *_: rank):  # same arguments, different traced IR
        ir = error_message(cp.attention, x, x, x, group)
    return {
        "theta": error_message(cp.attention, x, x, x, group, theta=10000.0 * (1 + rank)),
        "scaling": error_message(cp.attention, x, x, x, group, scaling=scaling),
        "length": error_message(cp.attention, longer, longer, longer, group),
        "dtype": error_message(cp.attention, half, half, half, group),
        "batch": error_message(cp.attention, batch, batch, batch, group),
        "grad": error_message(cp.attention, x, kv, kv, group),
        "one_refuses": error_message(cp.attention, odd, odd, odd, group),
        "ir": ir,
    }


def after_mismatches(group: Any, expected: torch.Tensor) -> bool:
    """Whether the group still runs a call on which the ranks agree, with the right output
    (this rank's share of `expected`, the rope_causal case's unsharded output)."""
    q, k, v, _ = (cp.shard(x, group) for x in inputs("rope_causal"))
    with af.backend("interpret"), torch.no_grad():
        out = cp.attention(q, k, v, group, **CASES["rope_causal"]["options"])
    return torch.allclose(out, cp.shard(expected, group), rtol=0, atol=1e-6)


def child(rank: int, world: int, init_file: str, out: str) -> None:
    """One rank: join the gloo group through `init_file`, run every case, save the results."""
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        group = dist.group.WORLD
        results: dict[str, Any] = {"cases": {c: sharded(c, group) for c in CASES}}
        results["errors"] = errors(group)
        results["layout"] = layout(group)
        short = dist.new_group(backend="gloo", timeout=timedelta(seconds=20))
        results["mismatches"] = mismatches(rank, short)
        results["after_mismatches"] = after_mismatches(short, results["cases"]["rope_causal"]["out"])
    except BaseException:
        results = {"failure": traceback.format_exc()}
    torch.save(results, out)
    dist.barrier()  # neither rank tears gloo down while the other still talks to it
    dist.destroy_process_group()


# --------------------------------------------------------------------------- the tests


def run_ranks(tmp: Path) -> tuple[list[subprocess.Popen], list[str], list[Path]]:
    """Start the WORLD children in folder `tmp` and wait for them (all of them stop as soon as one
    fails): (processes, logs, result files)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "ATTNFUSE_CACHE_DIR": str(tmp / "cache")}
    init, outs = tmp / "init", [tmp / f"rank{r}.pt" for r in range(WORLD)]
    log_files = [tmp / f"rank{r}.log" for r in range(WORLD)]
    procs = []
    for r in range(WORLD):
        with open(log_files[r], "w") as log:
            cmd = [sys.executable, __file__, str(r), str(WORLD), str(init), str(outs[r])]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break  # the others would wait for it until gloo's timeout
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return procs, [f.read_text() for f in log_files], outs


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict[str, Any]]:
    """Run the two children (while this process computes nothing: 2 cores) and load their results.
    A pair in which a child died of a signal runs once more: once in CI a child aborted inside
    torch's gloo ("terminate called without an active exception", no Python traceback), which
    did not happen again in seven reruns. A Python failure, or a second death, fails the tests."""
    procs, logs, outs = run_ranks(tmp_path_factory.mktemp("distributed"))
    if any(p.returncode is not None and p.returncode < 0 for p in procs):
        died = [f"rank {r}: {p.returncode}" for r, p in enumerate(procs) if p.returncode]
        warnings.warn(f"a distributed child died of a signal ({', '.join(died)}); running the pair again", stacklevel=1)
        procs, logs, outs = run_ranks(tmp_path_factory.mktemp("distributed"))
    results = []
    for r, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0 and outs[r].exists(), f"rank {r} exited with {p.returncode}:\n{log[-3000:]}"
        res = torch.load(outs[r])
        assert "failure" not in res, f"rank {r} failed:\n{res['failure']}"
        results.append(res)
    return results


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """A private kernel cache folder for this process's interpreted kernels."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("distributed-cache")))
        yield


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_output_and_gradients_equal_the_full_sequence(ranks, case):
    expected = full_sequence(case)
    for r, res in enumerate(ranks):
        got = res["cases"][case]
        for name in ("out", "dq", "dk", "dv"):
            assert got[name].shape == expected[name].shape, (r, name)
            err = rel_l2(got[name], expected[name])
            assert err < TOLERANCE, f"rank {r} {case} {name}: relative L2 error {err:.2e}"


def test_shard_layout(ranks):
    """Rank r holds chunks r and 3 - r of 4: tokens 4r..4r+3 and 12-4r..15-4r of 16."""
    for r, res in enumerate(ranks):
        expected = list(range(4 * r, 4 * r + 4)) + list(range(12 - 4 * r, 16 - 4 * r))
        assert res["layout"]["shard"] == expected
        assert res["layout"]["positions"] == expected
        assert res["layout"]["round_trip"]
        assert res["layout"]["dim_1"] == list(range(16))


ERRORS = {
    "shard_30": "divisible by 2 * world size = 4",
    "positions_30": "divisible by 2 * world size = 4",
    "odd_local": "local length must be even",
    "kv_cache": "same local length",
    "sink": "does not support sinks",
    "document": "does not support document masks",
    "window": "window must be None or an integer",
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_refusals(ranks, case):
    for res in ranks:
        assert ERRORS[case] in res["errors"][case]


MISMATCHES = {
    "theta": ["theta: rank 0 has 10000.0, rank 1 has 20000.0"] * 2,
    "scaling": ["scaling differs between rank 0 and rank 1"] * 2,
    "length": ["local length: rank 0 has 8, rank 1 has 16"] * 2,
    "dtype": ["q's dtype: rank 0 has torch.float32, rank 1 has torch.float16"] * 2,
    "batch": ["batch: rank 0 has 1, rank 1 has 2"] * 2,
    "grad": [
        "K/V gradients recorded (k or v requiring grad under grad mode; the backward is a collective): "
        "rank 0 has k and v, rank 1 has neither"
    ]
    * 2,  # fmt: skip
    "one_refuses": ["rank 1 of the group refused its arguments", "local length must be even"],
    "ir": ["the traced variant (its attn IR"] * 2,
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_ranks_that_disagree_are_refused_on_every_rank(ranks, case):
    """Arguments that differ across the ranks: an AttnFuseError on both ranks, naming what
    differs (each rank's value where it reads as one) or the rank that refused its own, and
    only that (no other field, and not the IR when another field differs)."""
    for r, res in enumerate(ranks):
        message = res["mismatches"][case]
        assert MISMATCHES[case][r] in message, f"rank {r}: {message!r}"
        if case != "one_refuses":
            assert f"this is rank {r}" in message
            fields = message.count(" has ") // 2 + message.count(" differs ")  # each rank's value, or "differs"
            assert fields == (3 if case == "dtype" else 1), message  # q's, k's and v's dtypes


def test_a_group_stays_usable_after_refused_calls(ranks):
    assert all(res["after_mismatches"] for res in ranks)


def test_no_process_group():
    assert not dist.is_initialized()
    x = torch.randn(1, 2, 8, 16)
    with pytest.raises(af.AttnFuseError, match="initialised torch.distributed process group"):
        cp.attention(x, x, x)
    with pytest.raises(af.AttnFuseError, match="initialised torch.distributed process group"):
        cp.shard(x)


if __name__ == "__main__":
    child(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
