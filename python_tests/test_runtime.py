"""The runtime: backend choice, the kernel cache (memory, disk, other processes), the
hot path, `Variant.compile`, and generated kernels under the Triton interpreter; the
disk cache as untrusted input, unusable cache folders, threads and processes starting
cold, inputs requiring grad, bf16 on the interpreter and degenerate shapes.

Cache tests compile with stand-ins of `compile_module` (stub_compiler.py) so that they
measure the machinery, not the lowering; the interpreter tests at the end use the
real compiler."""

from __future__ import annotations

import builtins
import errno
import json
import multiprocessing
import os
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import cache_child
import pytest
import stub_compiler
import torch

import attnfuse as af
from attnfuse import cache, cache_loader, dsl, launch, runtime
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


def test_one_hot_key_for_the_call_and_its_entry():
    q, k, v = qkv(nq=5, nk=300)
    ids = torch.zeros(1, 300, dtype=torch.int32)

    @af.variant
    def docs(q, k, v, ids, window=64):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.document(ids) & af.sliding_window(window))), v)

    with af.backend("interpret"), cache.use_compiler(stub_compiler.trivial_compile):
        docs(q, k, v, ids)
        docs(q, k, v, ids, 32)
    shapes = (q.shape, k.shape, v.shape)
    assert set(docs._hot) == {
        runtime._hot_key("interpret", q.device, q, k, v, shapes, (ids,)),
        runtime._hot_key("interpret", q.device, q, k, v, shapes, (ids, 32)),
    }
    assert runtime._hot_key("interpret", q.device, q, k, v, shapes, (ids,))[11] == cache.seq_bucket(5, 300) == 512


def test_device_sm_without_a_gpu():
    assert runtime.device_sm("cpu") == runtime.device_sm(torch.device("meta")) == 0
    if not torch.cuda.is_available():
        assert runtime.device_sm() == runtime.device_sm("cuda:0") == 0


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
    assert sorted(p.name for p in kernel_files(fresh_cache)) == sorted(
        [path.stem + s for s in (".py", ".mlir", ".lock")]
    )
    text = path.read_text()
    assert text.startswith(kern.source)
    assert text.splitlines()[-2].startswith("# attnfuse-launch-params: ")
    assert text.splitlines()[-1].startswith("# attnfuse-sha256: ")
    assert text == cache.entry_text(path.stem, kern.source, kern.launch_params)
    # private: folders 0700, files 0600
    assert {stat.S_IMODE(p.stat().st_mode) for p in (fresh_cache, path.parent)} == {0o700}
    assert {stat.S_IMODE(p.stat().st_mode) for p in kernel_files(fresh_cache)} == {0o600}
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
        with (
            cache.use_compiler(stub_compiler.reference_compile),
            pytest.warns(RuntimeWarning, match="ignores the cached kernel .*no hash line"),
        ):
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


# --------------------------------------------------------------------------- the disk as untrusted input


def cached_entry(fresh_cache: Path) -> Path:
    """Compile rope_causal's interpreted kernel for qkv() into the disk cache, forget it in
    memory, and return its file."""
    with af.backend("interpret"), cache.use_compiler(stub_compiler.reference_compile):
        rope_causal(*qkv())
    runtime.clear_caches()
    (py,) = [p for p in kernel_files(fresh_cache) if p.suffix == ".py"]
    return py


def plant(py: Path, source: str) -> None:
    """Replace the cache file `py` with `source`, carrying the right hash: a file that
    passes the integrity check (as one this user's AttnFuse wrote)."""
    py.write_text(cache.entry_text(py.stem, source, {}))
    py.chmod(0o600)


def call_recompiling(q, k, v, *, match: str):
    """rope_causal on the interpret backend, expecting one RuntimeWarning matching `match`
    and one compilation; returns the output."""
    before = compiles()
    with (
        af.backend("interpret"),
        cache.use_compiler(stub_compiler.reference_compile),
        pytest.warns(RuntimeWarning, match=match),
    ):
        out = rope_causal(q, k, v)
    assert compiles() == before + 1
    return out


def assert_rope_causal(out, q, k, v):
    torch.testing.assert_close(
        out.to(F64), run_reference(rope_causal.ir_module(q, k, v), q, k, v), atol=1e-5, rtol=1e-5
    )


def test_a_file_without_the_right_hash_is_not_executed(fresh_cache, tmp_path):
    py = cached_entry(fresh_cache)
    good = py.read_text()
    marker = tmp_path / "executed"
    # A file planted under the kernel's name, and the right file with one constant changed.
    planted = f"open({str(marker)!r}, 'w').close()\n\ndef launch(q, k, v):\n    return q, None\n"
    changed = good.replace("compute_dtype=torch.float32", "compute_dtype=torch.float16", 1)
    assert changed != good
    for text, why in [
        (planted + f"# attnfuse-launch-params: {{}}\n# attnfuse-sha256: {'0' * 64}\n", "does not match the hash"),
        (planted, "no hash line"),
        (changed, "does not match the hash"),
    ]:
        py.write_text(text)
        q, k, v = qkv()
        assert_rope_causal(call_recompiling(q, k, v, match=f"ignores the cached kernel .*{why}"), q, k, v)
        assert not marker.exists()
        assert py.read_text() == good  # replaced by a fresh compilation
        runtime.clear_caches()


def test_the_hash_binds_a_file_to_its_key(fresh_cache):
    py = cached_entry(fresh_cache)
    text = py.read_text()
    other = py.with_name("f" * 64 + ".py")  # the same (valid) file under another kernel's name
    other.write_text(text)
    with pytest.raises(ValueError, match="does not match the hash"):
        cache._split_source(text, other.stem)
    assert cache._split_source(text, py.stem)[1] == json.loads(text.splitlines()[-2].split(": ", 1)[1])


def test_a_cache_file_raising_system_exit_does_not_end_the_process(fresh_cache):
    plant(cached_entry(fresh_cache), "raise SystemExit(3)\n")
    q, k, v = qkv()
    assert_rope_causal(call_recompiling(q, k, v, match=r"it raised SystemExit\(3\) when imported"), q, k, v)


def test_a_cache_file_failing_at_launch_is_evicted_and_recompiled(fresh_cache):
    py = cached_entry(fresh_cache)
    good = py.read_text()
    plant(py, "def launch(*args, **kwargs):\n    raise RuntimeError('planted launch failure')\n")
    q, k, v = qkv()
    with af.backend("interpret"):
        before = af.runtime.stats()
        with (
            cache.use_compiler(stub_compiler.reference_compile),
            pytest.warns(RuntimeWarning, match="evicts the cached kernel .*planted launch failure"),
        ):
            out = rope_causal(q, k, v)
        after = af.runtime.stats()
        assert (after["disk_loads"], after["compiles"]) == (before["disk_loads"] + 1, before["compiles"] + 1)
        assert_rope_causal(out, q, k, v)
        assert py.read_text() == good
        with cache.use_compiler(stub_compiler.failing_compile):
            rope_causal(q, k, v)  # the fresh kernel stays
            rope_causal(*qkv(b=2, seed=3))
        # A kernel that fails again after its recompilation: the error propagates.
        runtime.clear_caches()
        plant(py, "def launch(*args, **kwargs):\n    raise RuntimeError('planted launch failure')\n")
        with (
            cache.use_compiler(stub_compiler.failing_compile),
            pytest.warns(RuntimeWarning, match="evicts"),
            pytest.raises(AssertionError, match="compiled a kernel it should have found"),
        ):
            rope_causal(q, k, v)


def test_untrusted_cache_files_are_refused(fresh_cache):
    py = cached_entry(fresh_cache)
    good = py.read_text()
    q, k, v = qkv()
    py.chmod(0o620)
    call_recompiling(q, k, v, match="ignores the cached kernel .*writable by its group or by others")
    assert stat.S_IMODE(py.stat().st_mode) == 0o600 and py.read_text() == good
    runtime.clear_caches()
    target = py.with_name("elsewhere.py")
    py.rename(target)
    py.symlink_to(target)
    call_recompiling(q, k, v, match="ignores the cached kernel .*not a regular file")
    assert not py.is_symlink()
    if os.geteuid() == 0:  # only root can give a file away
        runtime.clear_caches()
        os.chown(py, 65534, 65534)
        call_recompiling(q, k, v, match="ignores the cached kernel .*owned by user id 65534")
        assert py.stat().st_uid == 0


@pytest.mark.parametrize("problem", ["group-writable", "world-writable", "not owned"])
def test_untrusted_cache_folders_are_refused(fresh_cache, problem):
    py = cached_entry(fresh_cache)
    folder = py.parent if problem == "group-writable" else fresh_cache
    if problem == "not owned":
        if os.geteuid() != 0:
            pytest.skip("only root can give a folder away")
        os.chown(folder, 65534, 65534)
        match = "owned by user id 65534"
    else:
        folder.chmod(0o770 if problem == "group-writable" else 0o703)
        match = "writable by its group or by others"
    with af.backend("interpret"), cache.use_compiler(stub_compiler.reference_compile):
        with pytest.warns(RuntimeWarning, match=f"cannot use the kernel cache folder .*{match}.*ATTNFUSE_CACHE_DIR"):
            kern = rope_causal.compile(*qkv())
        assert fresh_cache not in Path(kern.path).parents  # not even read from there
        assert_rope_causal(kern(*qkv()), *qkv())


# --------------------------------------------------------------------------- an unusable cache folder


def fallback_calls() -> tuple[list[str], list[Path]]:
    """Two kernels (two sequence buckets) on the interpret backend, warnings recorded:
    (the warnings, the kernels' files)."""
    with warnings.catch_warnings(record=True) as seen, cache.use_compiler(stub_compiler.reference_compile):
        warnings.simplefilter("always")
        paths = []
        with af.backend("interpret"):
            for nk in (20, 200):
                q, k, v = qkv(nk=nk)
                assert_rope_causal(rope_causal(q, k, v), q, k, v)
                paths.append(Path(rope_causal.compile(q, k, v).path))
    return [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)], paths


def assert_fell_back(messages: list[str], paths: list[Path], configured: Path, why: str) -> None:
    (message,) = messages
    assert f"cannot use the kernel cache folder {configured}" in message and why in message
    assert "ATTNFUSE_CACHE_DIR" in message
    for path in paths:
        assert path.exists() and configured not in path.parents
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_cache_folder_that_cannot_be_created_falls_back(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(blocker / "cache"))
    assert_fell_back(*fallback_calls(), blocker / "cache", "cannot be created")


def test_an_unwritable_home_falls_back(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-home"
    blocker.write_text("")
    monkeypatch.delenv("ATTNFUSE_CACHE_DIR")
    monkeypatch.setenv("HOME", str(blocker))
    assert_fell_back(*fallback_calls(), blocker / ".cache" / "attnfuse", "cannot be created")


def test_a_full_disk_falls_back(fresh_cache, monkeypatch):
    write = cache._write_atomic

    def full_disk(path, text):
        if fresh_cache in path.parents:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, text)

    monkeypatch.setattr(cache, "_write_atomic", full_disk)
    assert_fell_back(*fallback_calls(), fresh_cache, "No space left on device")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_cache_folder_falls_back(fresh_cache):
    fresh_cache.mkdir(mode=0o500)
    try:
        assert_fell_back(*fallback_calls(), fresh_cache, "")
    finally:
        fresh_cache.chmod(0o700)


# --------------------------------------------------------------------------- threads


@af.variant
def causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def concurrent_first_calls(n_threads: int = 6, calls: int = 3) -> list[str]:
    """Threads making their first interpret calls at once (real kernels: two variants), then
    more calls; the failures, described. The main thread calls again afterwards."""
    variants = [causal, rope_causal]
    inputs = [qkv(hq=2, hkv=2, nq=16, nk=16, d=16, dv=16, seed=i) for i in range(n_threads)]
    expected = [run_reference(variants[i % 2].ir_module(*x), *x) for i, x in enumerate(inputs)]
    start, failures = threading.Barrier(n_threads), []

    def work(i: int) -> None:
        try:
            start.wait(timeout=60)
            with af.backend("interpret"):
                for _ in range(calls):
                    out = variants[i % 2](*inputs[i])
                    torch.testing.assert_close(out.to(F64), expected[i], atol=2e-4, rtol=2e-4)
        except Exception as e:
            failures.append(f"thread {i}: {e!r}"[:300])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    with af.backend("interpret"):
        for i in range(2):
            torch.testing.assert_close(variants[i](*inputs[i]).to(F64), expected[i], atol=2e-4, rtol=2e-4)
    return failures


def test_threads_making_their_first_interpret_calls_at_once(monkeypatch):
    monkeypatch.setattr(cache_loader, "_library_swaps", None)  # as in a new process: Triton's library not yet searched
    assert concurrent_first_calls() == []
    assert compiles() >= 2


def test_an_interpreted_launch_leaves_triton_language_as_it_found_it():
    """Triton 3.6's interpreter leaves `triton.language.core`'s builtins bound to itself after
    an interpreted kernel calls a library function (`tl.max`, `tl.sum`...): a later
    compilation for a GPU in the same process then fails in its front end. The interpreted
    launch puts every name back."""
    import triton.language as tl

    namespaces = cache_loader._language_namespaces()
    before = [dict(vars(n)) for n in namespaces]
    x = qkv(b=1, hq=2, hkv=2, nq=17, nk=17, d=16, dv=16, dtype=torch.float32)
    with af.backend("interpret"):
        rope_causal(*x)  # its softmax calls tl.max and tl.sum
    changed = [
        f"{getattr(n, '__name__', n)}.{name}"
        for n, saved in zip(namespaces, before, strict=True)
        for name, value in vars(n).items()
        if name in saved and saved[name] is not value
    ]
    assert changed == []
    assert [a for a in vars(tl.tensor) if a not in before[namespaces.index(tl.tensor)]] == []


def test_threads_with_triton_interpret_set_at_start(fresh_cache):
    """A process started with TRITON_INTERPRET=1 has no library functions to swap; its
    interpreted launches are serialised all the same."""
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r})\n"
        "import test_runtime\n"
        "print('failures:', test_runtime.concurrent_first_calls())\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "ATTNFUSE_CACHE_DIR": str(fresh_cache)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "failures: []"


# --------------------------------------------------------------------------- other processes


def run_children(modes: list[str], cache_dir: Path) -> list[tuple[int, dict, float]]:
    """Run `cache_child.call` in one spawned process per mode, all starting their call at
    once; their (pid, stats, error) results."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(modes)), ctx.Queue()
    procs = [ctx.Process(target=cache_child.call, args=(m, str(cache_dir), barrier, results)) for m in modes]
    for p in procs:
        p.start()
    try:
        out = [results.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
    for pid, stats, detail in out:
        assert stats is not None, f"child {pid} failed:\n{detail}"
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return out


def test_a_new_process_reuses_the_disk_entry(fresh_cache):
    q, k, v = qkv()
    with af.backend("interpret"), cache.use_compiler(stub_compiler.reference_compile):
        rope_causal(q, k, v)
    ((_, stats, err),) = run_children(["failing"], fresh_cache)  # compiling would raise there
    assert stats["compiles"] == 0 and stats["disk_loads"] == 1
    assert err < 1e-5


def test_processes_starting_cold_compile_once(fresh_cache):
    """Three processes make the same first call at once: one compiles (the entry's file
    lock), the others wait and load its file."""
    results = run_children(["reference"] * 3, fresh_cache)
    assert all(err < 1e-5 for _, _, err in results)
    assert sorted(stats["compiles"] for _, stats, _ in results) == [0, 0, 1]
    assert sorted(stats["disk_loads"] for _, stats, _ in results) == [0, 1, 1]
    files = kernel_files(fresh_cache)
    assert [p.suffix for p in files] == [".lock", ".mlir", ".py"]  # one entry, no temporary files left
    module = cache.load_module(files[2], interpret=True, name="t_shared_entry")
    q, k, v = qkv()
    out, _ = module.launch(q, k, v)
    assert_rope_causal(out, q, k, v)


# --------------------------------------------------------------------------- gradients, bf16, degenerate shapes


def test_kernel_backends_refuse_inputs_that_require_grad():
    @af.variant
    def sinks(q, k, v, sink):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal), sink=sink), v)

    q, k, v = qkv()
    sink = rand(4, seed=5)

    def grad(t: torch.Tensor) -> torch.Tensor:
        return t.detach().clone().requires_grad_()

    with af.backend("interpret"), cache.use_compiler(stub_compiler.trivial_compile):
        assert sinks(q, k, v, sink) is q  # compiled (the trivial launch returns q)
        for args, names in [
            ((grad(q), k, v, sink), "q requires"),
            ((q, grad(k), grad(v), sink), "k, v require"),
            ((q, k, v, grad(sink)), "sink requires"),
        ]:
            with pytest.raises(af.AttnFuseError, match=f"^{names} grad, but the interpret backend has no backward"):
                sinks(*args)  # the hot path
            with pytest.raises(af.AttnFuseError, match=f"^{names} grad"):
                sinks.compile(*args)(*args)
            with torch.no_grad():
                assert sinks(*args) is args[0]
        before = compiles()
        with pytest.raises(af.AttnFuseError, match="^q requires grad"):
            rope_causal(grad(q), k, v)  # the slow path refuses before compiling
        assert compiles() == before
    # reference stays differentiable
    q, k, v = (t.detach().requires_grad_() for t in qkv())
    with af.backend("reference"):
        out = rope_causal(q, k, v)
    assert out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_interpret_runs_bf16_through_the_float32_kernel():
    @af.variant
    def normed(q, k, v, w):
        q = af.rope(af.qk_norm(q, w), theta=10000.0)
        k = af.rope(af.qk_norm(k, w), theta=10000.0)
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    q, k, v = qkv(b=2, hq=4, hkv=2, nq=19, nk=45, d=32, dv=32, dtype=torch.bfloat16)
    w = (rand(32, seed=7).abs() + 0.5).to(torch.bfloat16)
    oracle = run_reference(normed.ir_module(q, k, v, w), q, k, v, w)
    with af.backend("interpret"):
        out = normed(q, k, v, w)
        kern = normed.compile(q, k, v, w)
    assert out.dtype == torch.bfloat16 and out.shape == oracle.shape
    torch.testing.assert_close(out.to(F64), oracle, atol=2e-2, rtol=2e-2)
    assert "bf16" in normed.ir(q, k, v, w) and "bfloat16" not in kern.source
    out2, lse = kern.run_with_lse(q, k, v, w)
    assert out2.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(kern.launch(q, k, v, w)[0], out)


def degenerate(backend: str, b=1, hq=4, hkv=2, nq=5, nk=7, d=16, dv=16, sink=False):
    """(out, lse, q, k, v, extras) of a causal variant (with a sink if asked) on `backend`:
    `reference` through the runtime and run_reference_with_lse, `interpret` through the
    runtime and a compiled Kernel."""

    @af.variant
    def with_sink(q, k, v, s):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal), sink=s), v)

    variant = with_sink if sink else causal
    q, k, v = qkv(b=b, hq=hq, hkv=hkv, nq=nq, nk=nk, d=d, dv=dv)
    extras = (rand(hq, seed=9),) if sink else ()
    with af.backend(backend):
        out = variant(q, k, v, *extras)
        if backend == "interpret":
            out2, lse = variant.compile(q, k, v, *extras).run_with_lse(q, k, v, *extras)
        else:
            out2, lse = run_reference_with_lse(variant.ir_module(q, k, v, *extras), q, k, v, *extras)
    torch.testing.assert_close(out2.to(out.dtype), out)
    return out, lse, extras


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_no_keys_give_zeros(backend):
    out, lse, _ = degenerate(backend, nk=0)
    assert out.shape == (1, 4, 5, 16) and not out.any()
    assert lse.shape == (1, 4, 5) and torch.isneginf(lse).all()
    out, lse, (sink,) = degenerate(backend, nk=0, sink=True)
    assert not out.any()
    torch.testing.assert_close(lse.float(), sink.view(1, 4, 1).expand(1, 4, 5))  # the sink's own term


@pytest.mark.parametrize("backend", ["reference", "interpret"])
@pytest.mark.parametrize("shape", [dict(nq=0), dict(nq=0, nk=0), dict(b=0)], ids=["Nq=0", "Nq=Nk=0", "B=0"])
def test_no_queries_or_batch_give_an_empty_output(backend, shape):
    out, lse, _ = degenerate(backend, **shape)
    assert out.numel() == 0 and lse.numel() == 0
    assert out.shape == (shape.get("b", 1), 4, shape.get("nq", 5), 16)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
@pytest.mark.parametrize(
    "shape,message",
    [
        (dict(hq=0), r"q has no heads \(dim 1"),
        (dict(hkv=0), r"k has no heads \(dim 1"),
        (dict(d=0), r"q has head dim 0 \(dim 3"),
        (dict(dv=0), r"v has head dim 0 \(dim 3"),
    ],
)
def test_no_heads_or_channels_are_an_error(backend, shape, message):
    with pytest.raises(af.AttnFuseError, match=message):
        degenerate(backend, **shape)


def test_reference_without_keys_stays_differentiable():
    q, k, v = (t.requires_grad_() for t in qkv(nk=0))
    with af.backend("reference"):
        causal(q, k, v).sum().backward()
    assert not q.grad.any() and q.grad.shape == q.shape and v.grad.shape == v.shape


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
    def k_rotated_twice(q, k, v):
        q = af.rope(q)
        k = af.rope(af.rope(k, theta=500.0))
        return af.pv(af.softmax(af.qk(q, k)), v)

    args = qkv()
    with (
        af.backend("interpret"),
        pytest.raises(
            af.AttnFuseError, match=r"the Triton lowering cannot compile k_rotated_twice: .*at most one attn.rope"
        ),
    ):
        k_rotated_twice(*args)
    with af.backend("reference"):
        k_rotated_twice(*args)  # the reference backend runs what the dialect can say


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


def test_the_lse_workspace_always_holds_the_call_s_log_sum_exp(monkeypatch):
    """Calls that discard lse hand the kernel a shared buffer: it must have room for
    B * Hq * Nq floats of every call (the kernel writes that many, unchecked), grow when a call
    needs more, and be kept (not re-allocated) when it has room."""
    monkeypatch.setattr(launch, "LSE_WORKSPACES", {})
    small = torch.empty(1, 2, 10, 4)
    ws = launch.lse_workspace(small)
    assert ws.dtype == torch.float32 and ws.is_contiguous() and ws.numel() >= 20
    big = torch.empty(3, 8, 5000, 4)
    grown = launch.lse_workspace(big)
    assert grown.numel() >= 3 * 8 * 5000 and grown.device == big.device
    assert launch.lse_workspace(small) is grown and launch.lse_workspace(big) is grown
    runtime.clear_caches()
    assert launch.LSE_WORKSPACES == {}


def test_a_deep_score_mod_chain_runs_on_the_interpreter():
    """300 chained ops in a score_mod: the printer names every 24th level of the inlined
    expression (it used to recurse once per op, a RecursionError), and the kernel matches
    the reference."""

    @af.variant
    def deep(q, k, v):
        def mod(s, b, h, q_idx, kv_idx):
            for _ in range(300):
                s = s * 1.0001 + 0.0
            return s

        return af.pv(af.softmax(af.score_mod(af.qk(q, k), mod)), v)

    args = qkv(nq=8, nk=8)
    interpret_matches_reference(deep, args, torch.float32)
    assert max(_paren_depth(line) for line in deep.compile(*args).source.splitlines()) <= 2 * 24


def _paren_depth(line: str) -> int:
    """How deep parentheses nest in `line`."""
    depth = deepest = 0
    for c in line:
        depth += (c == "(") - (c == ")")
        deepest = max(deepest, depth)
    return deepest


def test_a_slow_interpreter_call_warns_once_with_its_expected_time(monkeypatch):
    """The interpreter's expected forward time is B * Hq * Nq * Nk times a calibrated cost;
    from SLOW_INTERPRET_SECONDS on, the first such call of the process warns."""
    monkeypatch.setattr(launch, "_slow_warned", False)
    q, k, v = qkv(nq=8, nk=8)
    with af.backend("interpret"), warnings.catch_warnings():
        warnings.simplefilter("error", launch.SlowInterpreterWarning)  # the small call does not warn
        rope_causal(q, k, v)
    monkeypatch.setattr(launch, "INTERPRET_SECONDS_PER_SCORE", 1.0)  # as if 512 scores took 512 s
    with af.backend("interpret"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rope_causal(q, k, v)
        rope_causal(q, k, v)
        rope_causal.compile(q, k, v)(q, k, v)
    slow = [w for w in seen if issubclass(w.category, launch.SlowInterpreterWarning)]
    assert len(slow) == 1, [str(w.message) for w in seen]
    assert "B 1, 4 heads, Nq 8, Nk 8) is expected to take about 256 s forward" in str(slow[0].message)
    assert slow[0].filename == __file__  # points at the caller's line
    assert (
        issubclass(launch.SlowInterpreterWarning, UserWarning)
        and af.SlowInterpreterWarning is launch.SlowInterpreterWarning
    )


def test_the_interpreter_estimate_for_the_reported_case():
    """The issue's case, 49 s for one forward at N = 1024 on a 2-core CPU (B 1, 2 heads),
    is well above the warning's threshold; a test-sized call (N 128, 8 heads) is below."""
    assert 1 * 2 * 1024 * 1024 * launch.INTERPRET_SECONDS_PER_SCORE > launch.SLOW_INTERPRET_SECONDS
    assert 2 * 8 * 128 * 128 * launch.INTERPRET_SECONDS_PER_SCORE < launch.SLOW_INTERPRET_SECONDS
