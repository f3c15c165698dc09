"""The runtime: backend choice, the kernel cache (memory, disk, other processes), the
hot path, `Variant.compile`, and generated kernels under the Triton interpreter.

Cache tests compile with stand-ins of `compile_module` (stub_compiler.py) so that they
measure the machinery, not the lowering; the interpreter tests at the end use the
real compiler."""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import stub_compiler
import torch

import attnfuse as af
from attnfuse import cache, dsl, runtime
from attnfuse.reference import run_reference, run_reference_with_lse

HERE = Path(__file__).parent
F64 = torch.float64


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Each test gets an empty cache folder and forgets what earlier tests loaded."""
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNFUSE_BACKEND", raising=False)
    runtime.clear_caches()
    yield tmp_path / "cache"
    runtime.clear_caches()


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def qkv(b=1, hq=4, hkv=2, nq=12, nk=20, d=16, dv=16, dtype=torch.float32, seed=0):
    return (
        rand(b, hq, nq, d, dtype=dtype, seed=seed),
        rand(b, hkv, nk, d, dtype=dtype, seed=seed + 1),
        rand(b, hkv, nk, dv, dtype=dtype, seed=seed + 2),
    )


@af.variant
def rope_causal(q, k, v):
    q = af.rope(q, theta=10000.0)
    k = af.rope(k, theta=10000.0)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def compiles() -> int:
    return af.runtime.stats()["compiles"]


def kernel_files(folder: Path) -> list[Path]:
    return sorted((folder / "kernels").glob("*"))


# --------------------------------------------------------------------------- backends


def test_auto_is_reference_on_cpu_and_returns_q_dtype():
    q, k, v = qkv(dtype=torch.bfloat16)
    with cache.use_compiler(stub_compiler.failing_compile):
        out = rope_causal(q, k, v)
    assert out.dtype == torch.bfloat16
    oracle = run_reference(rope_causal.ir_module(), q, k, v)
    torch.testing.assert_close(out.to(F64), oracle, atol=2e-2, rtol=2e-2)


def test_backend_context_manager_env_var_and_threads(monkeypatch):
    assert runtime.current_backend() == "auto"
    monkeypatch.setenv("ATTNFUSE_BACKEND", "interpret")
    assert runtime.current_backend() == "interpret"
    with af.backend("reference"):
        assert runtime.current_backend() == "reference"
        with af.backend("triton"):
            assert runtime.current_backend() == "triton"
        assert runtime.current_backend() == "reference"
        seen = []
        worker = threading.Thread(target=lambda: seen.append(runtime.current_backend()))
        worker.start()
        worker.join()
        assert seen == ["interpret"]  # another thread does not see this thread's af.backend
    assert runtime.current_backend() == "interpret"


def test_env_var_selects_interpret(monkeypatch):
    monkeypatch.setenv("ATTNFUSE_BACKEND", "interpret")
    q, k, v = qkv()
    with cache.use_compiler(stub_compiler.reference_compile):
        out = rope_causal(q, k, v)
    assert compiles() >= 1
    torch.testing.assert_close(out.to(F64), run_reference(rope_causal.ir_module(), q, k, v), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the cache


def test_second_call_compiles_nothing_and_buckets(fresh_cache):
    traces, start = af.runtime.stats()["traces"], compiles()
    with af.backend("interpret"), cache.use_compiler(stub_compiler.reference_compile):
        q, k, v = qkv(nq=12, nk=20)
        out = rope_causal(q, k, v)
        assert compiles() == start + 1
        rope_causal(q, k, v)
        rope_causal(*qkv(b=2, nq=100, nk=128, seed=5))  # same bucket (128): N is a runtime argument
        assert compiles() == start + 1
        rope_causal(*qkv(nq=3, nk=129))  # bucket 256: a new kernel
        assert compiles() == start + 2
    assert af.runtime.stats()["traces"] == traces + 1
    torch.testing.assert_close(out.to(F64), run_reference(rope_causal.ir_module(), q, k, v), atol=1e-5, rtol=1e-5)
    assert len([p for p in kernel_files(fresh_cache) if p.suffix == ".py"]) == 2


def test_seq_bucket():
    assert [cache.seq_bucket(n, 1) for n in (1, 127, 128, 129, 1000, 4096)] == [128, 128, 128, 256, 1024, 4096]
    assert cache.seq_bucket(5, 300) == 512


def test_key_covers_every_field():
    base = cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 128, 90, False)
    variants = [
        cache.KernelSpec("ir2", ("f16",) * 3, (4, 2), (64, 64), 128, 90, False),
        cache.KernelSpec("ir", ("bf16",) * 3, (4, 2), (64, 64), 128, 90, False),
        cache.KernelSpec("ir", ("f16",) * 3, (4, 4), (64, 64), 128, 90, False),
        cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 32), 128, 90, False),
        cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 256, 90, False),
        cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 128, 80, False),
        cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 128, 0, True),
    ]
    keys = {base.key(), *(s.key() for s in variants)}
    assert len(keys) == 1 + len(variants)
    assert base.key() == cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 128, 90, False).key()


def test_disk_entry_is_complete_and_atomic(fresh_cache):
    q, k, v = qkv()
    with cache.use_compiler(stub_compiler.reference_compile):
        kern = rope_causal.compile(q, k, v)
    path = Path(kern.path)
    assert path.parent == fresh_cache / "kernels" and path.suffix == ".py"
    assert sorted(p.name for p in kernel_files(fresh_cache)) == sorted([path.name, path.stem + ".mlir"])
    text = path.read_text()
    assert text.startswith(kern.source)
    assert text.splitlines()[-1].startswith("# attnfuse-launch-params: ")
    assert kern.launch_params == {
        "attn_fwd": {"grid": [1, 1], "num_warps": 4, "num_stages": 1, "constexprs": {"SEQ_LEN": 128}}
    }
    assert "attn.rope" in (path.with_suffix(".mlir")).read_text()
    assert kern.interpreted  # CPU tensors: the interpreter's kernel
    out, lse = kern.run_with_lse(q, k, v)
    ref_out, ref_lse = run_reference_with_lse(rope_causal.ir_module(), q, k, v)
    torch.testing.assert_close(out.to(F64), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.to(F64), ref_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kern(q, k, v), out)


def test_kernel_called_with_another_signature():
    q, k, v = qkv()
    with cache.use_compiler(stub_compiler.reference_compile):
        kern = rope_causal.compile(q, k, v)
    kern(*qkv(b=3, nq=40, nk=50))  # other lengths and batch are fine
    with pytest.raises(
        af.AttnFuseError, match=r"this kernel of rope_causal was compiled for q/k/v .*4/2 heads.*got .*2/2 heads"
    ):
        kern(*qkv(hq=2))


def test_memory_then_disk_then_compile(fresh_cache):
    q, k, v = qkv()
    with af.backend("interpret"):
        with cache.use_compiler(stub_compiler.reference_compile):
            rope_causal(q, k, v)
        runtime.clear_caches()  # as a new process would: nothing in memory, the file on disk
        loads = af.runtime.stats()["disk_loads"]
        with cache.use_compiler(stub_compiler.failing_compile):
            out = rope_causal(q, k, v)
        assert af.runtime.stats()["disk_loads"] == loads + 1
        (py,) = [p for p in kernel_files(fresh_cache) if p.suffix == ".py"]
        py.write_text("this is not python\n")  # a damaged entry is recompiled and replaced
        runtime.clear_caches()
        before = compiles()
        with cache.use_compiler(stub_compiler.reference_compile):
            again = rope_causal(q, k, v)
        assert compiles() == before + 1 and "def launch" in py.read_text()
    torch.testing.assert_close(again, out)


def test_hot_path_does_no_tracing_ir_work_or_file_io(monkeypatch):
    q, k, v = qkv()
    ids = torch.zeros(1, 20, dtype=torch.int32)

    @af.variant
    def docs(q, k, v, ids):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.document(ids))), v)

    with af.backend("interpret"), cache.use_compiler(stub_compiler.trivial_compile):
        rope_causal(q, k, v)
        docs(q, k, v, ids)

        def forbidden(*args, **kwargs):
            raise AssertionError("the hot path traced, touched IR or did file I/O")

        monkeypatch.setattr(dsl, "trace", forbidden)
        monkeypatch.setattr(cache.KernelCache, "get", forbidden)
        monkeypatch.setattr(cache, "load_module", forbidden)
        monkeypatch.setattr(builtins, "open", forbidden)
        monkeypatch.setattr(os, "stat", forbidden)
        monkeypatch.setattr(Path, "exists", forbidden)
        assert rope_causal(q, k, v) is q  # the trivial launch's output
        assert rope_causal(*qkv(b=2, nq=5, nk=64)) is not None
        assert docs(q, k, v, ids) is q
        with pytest.raises(af.AttnFuseError, match="ids must have size 20"):
            docs(q, k, v, ids[:, :10])


def test_load_module_sets_triton_interpret_only_while_importing(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    src = stub_compiler.reference_compile(rope_causal.ir_module(*qkv()), sm=0, seq_len=128).source
    path = tmp_path / "generated.py"
    path.write_text(src)
    interpreted = cache.load_module(path, interpret=True, name="t_interp")
    compiled = cache.load_module(path, interpret=False, name="t_compiled")
    assert interpreted.IMPORTED_WITH_TRITON_INTERPRET == "1"
    assert compiled.IMPORTED_WITH_TRITON_INTERPRET == "0"
    assert "TRITON_INTERPRET" not in os.environ


# --------------------------------------------------------------------------- other processes

CHILD = textwrap.dedent(
    """
    import functools, json, os, sys, time
    sys.path.insert(0, {tests!r})
    import torch
    import attnfuse as af
    from attnfuse import cache
    import stub_compiler
    from attnfuse.reference import run_reference

    @af.variant
    def rope_causal(q, k, v):
        q = af.rope(q, theta=10000.0)
        k = af.rope(k, theta=10000.0)
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 12, 16, generator=g)
    k, v = torch.randn(1, 2, 20, 16, generator=g), torch.randn(1, 2, 20, 16, generator=g)
    mode, barrier, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    compile_fn = {{"reference": functools.partial(stub_compiler.reference_compile, delay=0.5),
                  "failing": stub_compiler.failing_compile}}[mode]
    rope_causal.ir(q, k, v), cache.triton_version(), cache.version_fingerprint()  # the slow parts, before
    open(os.path.join(barrier, str(os.getpid())), "w").close()  # start together: wait for the others
    deadline = time.time() + 120
    while len(os.listdir(barrier)) < count and time.time() < deadline:
        time.sleep(0.01)
    with af.backend("interpret"), cache.use_compiler(compile_fn):
        out = rope_causal(q, k, v)
    err = (out.double() - run_reference(rope_causal.ir_module(), q, k, v)).abs().max().item()
    print(json.dumps({{"stats": af.runtime.stats(), "err": err}}))
    """
).format(tests=str(HERE))


def run_children(modes: list[str], cache_dir: Path, barrier: Path) -> list[dict]:
    """Run CHILD once per mode, all at once; they start their calls together."""
    env = {**os.environ, "ATTNFUSE_CACHE_DIR": str(cache_dir)}
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, str(barrier), str(len(modes))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in modes
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_a_new_process_reuses_the_disk_entry(fresh_cache, tmp_path):
    q, k, v = qkv()
    with af.backend("interpret"), cache.use_compiler(stub_compiler.reference_compile):
        rope_causal(q, k, v)
    (child,) = run_children(["failing"], fresh_cache, tmp_path / "barrier")  # compiling would raise there
    assert child["stats"]["compiles"] == 0 and child["stats"]["disk_loads"] == 1
    assert child["err"] < 1e-5


def test_two_processes_compiling_the_same_kernel(fresh_cache, tmp_path):
    results = run_children(["reference", "reference"], fresh_cache, tmp_path / "barrier")
    assert all(r["err"] < 1e-5 for r in results)
    assert [r["stats"]["compiles"] for r in results] == [1, 1]  # both compiled at once (the barrier)
    files = kernel_files(fresh_cache)
    assert [p.suffix for p in files] == [".mlir", ".py"]  # one entry, no temporary files left
    module = cache.load_module(files[1], interpret=True, name="t_shared_entry")
    q, k, v = qkv()
    out, _ = module.launch(q, k, v)
    oracle = run_reference(rope_causal.ir_module(q, k, v), q, k, v)
    torch.testing.assert_close(out.to(F64), oracle, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- generated kernels, interpreted

INTERP_ATOL = {torch.float16: 4e-3, torch.float32: 2e-4}


def interpret_matches_reference(variant, args, dtype):
    with af.backend("interpret"):
        out = variant(*args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    oracle = run_reference(variant.ir_module(*args), *tensors)
    assert out.dtype == dtype and out.shape == oracle.shape
    torch.testing.assert_close(out.to(F64), oracle, atol=INTERP_ATOL[dtype], rtol=INTERP_ATOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_interpret_rope_causal_gqa_nq_ne_nk(dtype):
    interpret_matches_reference(rope_causal, qkv(b=2, hq=4, hkv=2, nq=19, nk=45, d=32, dv=32, dtype=dtype), dtype)


def test_interpret_softcap_alibi_sink_strided():
    @af.variant
    def mixed(q, k, v, slopes, sink):
        s = af.softcap(af.bias(af.qk(q, k, scale=0.2), af.alibi(slopes)), 30.0)
        return af.pv(af.softmax(af.mask(s, af.sliding_window(9)), sink=sink), v)

    q = rand(1, 33, 4, 32, seed=1).transpose(1, 2)  # strided views
    k = rand(1, 33, 1, 32, seed=2).transpose(1, 2)
    v = rand(1, 33, 1, 16, seed=3).transpose(1, 2)
    interpret_matches_reference(mixed, (q, k, v, af.alibi_slopes(4), rand(4, seed=4)), torch.float32)


def test_interpret_qk_norm_custom_mask_with_ids():
    @af.variant
    def custom(q, k, v, w, ids):
        q = af.rope(af.qk_norm(q, w), theta=1000.0, style="interleaved")
        k = af.rope(af.qk_norm(k, w), theta=1000.0, style="interleaved")
        s = af.mask(af.qk(q, k), lambda b, h, qi, kv: (ids[b, qi] == ids[b, kv]) & (kv <= qi) | (kv % 7 == 0))
        return af.pv(af.softmax(af.score_mod(s, lambda x, b, h, qi, kv: x - (qi - kv) // 4)), v)

    q, k, v = qkv(b=2, hq=2, hkv=2, nq=21, nk=21, d=16, dv=16, dtype=torch.float16)
    ids = torch.tensor([[0] * 9 + [1] * 12, [2] * 21], dtype=torch.int32)
    interpret_matches_reference(custom, (q, k, v, rand(16, seed=9).abs() + 0.5, ids), torch.float16)


def test_interpret_prefix_lm_scales_partial_rotary_inv_freq_custom_bias():
    @af.variant
    def assorted(q, k, v, freqs):
        q = af.scale(af.rope(q, rotary_dim=8, inv_freq=freqs), 0.7)
        k = af.rope(k, theta=500.0, rotary_dim=8, scaling=af.linear_scaling(2.0))
        s = af.scale(af.qk(q, k), 1.3)
        s = af.bias(s, lambda b, h, qi, kv: ((kv - qi) // 3) * 0.1 + (kv - qi) % 4 - h)
        return af.pv(af.softmax(af.mask(s, af.prefix_lm(5))), v)

    q, k, v = qkv(b=1, hq=3, hkv=1, nq=17, nk=29, d=16, dv=8, dtype=torch.float16)
    interpret_matches_reference(assorted, (q, k, v, torch.tensor([1.0, 0.5, 0.1, 0.02])), torch.float16)


def test_a_variant_the_lowering_cannot_compile():
    @af.variant
    def mixed_styles(q, k, v):
        q = af.rope(q, style="half")
        k = af.rope(k, style="interleaved")
        return af.pv(af.softmax(af.qk(q, k)), v)

    args = qkv()
    with (
        af.backend("interpret"),
        pytest.raises(af.AttnFuseError, match=r"the Triton lowering cannot compile mixed_styles: .*share style"),
    ):
        mixed_styles(*args)
    with af.backend("reference"):
        mixed_styles(*args)  # the reference backend runs what the dialect can say


def test_interpret_int64_ids_bool_table_and_math_functions():
    @af.variant
    def tables(q, k, v, ids, allowed):
        s = af.mask(af.qk(q, k), lambda b, h, qi, kv: (ids[b, qi] == ids[b, kv]) & allowed[h, kv % 4])
        s = af.score_mod(
            s, lambda x, b, h, qi, kv: af.where(x > 0, af.tanh(x), x * 0.5) + af.exp2(-af.abs(qi - kv) * 0.1)
        )
        return af.pv(af.softmax(s), v)

    q, k, v = qkv(b=2, hq=4, hkv=2, nq=13, nk=19, d=16, dv=16, dtype=torch.float16)
    ids = torch.tensor([[0] * 9 + [1] * 10, [3] * 19])  # int64
    allowed = torch.rand(4, 4, generator=torch.Generator().manual_seed(7)) > 0.3  # bool
    interpret_matches_reference(tables, (q, k, v, ids, allowed), torch.float16)
