"""Differentiable variant calls on the `interpret` backend (attnfuse/autograd.py): the
`attnfuse::attention` custom ops, what autograd saves and differentiates, the backward
kernels' cache keys, double backward, torch.compile(fullgraph=True), bf16, and gradients
the compiler cannot form.

Most tests compile with a stand-in of `compile_module` (`compile_with_backward` below:
the forward of stub_compiler.py, and a backward module whose `launch` runs float64
autograd over the reference executor), so that they check the runtime's machinery fast.
The tests at the end use the real compiler's backward kernels, under the interpreter,
against float64 autograd of the reference executor; they are skipped while the compiler
has no backward."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import stub_compiler
import torch
from xdsl.dialects.func import FuncOp
from xdsl.utils.exceptions import DiagnosticException

import attnfuse as af
from attnfuse import autograd, cache, runtime, variants
from attnfuse.reference import run_reference

F64 = torch.float64


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Each test gets an empty cache folder, forgets what earlier tests loaded and starts
    with no record of compilations."""
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNFUSE_BACKEND", raising=False)
    runtime.clear_caches()
    COMPILED.clear()
    yield tmp_path / "cache"
    runtime.clear_caches()


# --------------------------------------------------------------------------- a stand-in backward compiler

BACKWARD_SOURCE = '''"""Stand-in backward module (test_autograd.py): float64 autograd of the reference."""
import torch

from attnfuse.autograd import recording
from attnfuse.ir import parse_module
from attnfuse.reference import run_reference

_MODULE = parse_module({ir!r})
WRT = {wrt!r}


def launch(*args):
    *inputs, out, lse, dout = args
    with recording():
        xs = [x.detach().double().requires_grad_(i in WRT) if x.is_floating_point() else x
              for i, x in enumerate(inputs)]
        o = run_reference(_MODULE, *xs, compute_dtype=torch.float64)
        grads = torch.autograd.grad(o, [xs[i] for i in WRT], dout.double(), allow_unused=True)
    return tuple(torch.zeros_like(inputs[i]) if g is None else g.to(inputs[i].dtype) for i, g in zip(WRT, grads))
'''

COMPILED: list[tuple[str, tuple[int, ...], str]] = []
"""(direction, wrt, IR) of each compilation by `compile_with_backward`."""


def compile_with_backward(module, *, sm=None, seq_len=None, direction="fwd", wrt=()):
    """compile_module's stand-in with a backward: refuses, as the compiler does, a
    gradient with respect to an argument named `slopes` (ALiBi slopes are constants)."""
    COMPILED.append((direction, tuple(wrt), str(module)))
    if direction == "fwd":
        return stub_compiler.reference_compile(module, sm=sm, seq_len=seq_len)
    func = next(op for op in module.walk() if isinstance(op, FuncOp))
    for i in wrt:
        if (name := func.body.block.args[i].name_hint) == "slopes":
            raise DiagnosticException(f"argument {i} (%{name}) has no derivative: ALiBi slopes are constants")
    return SimpleNamespace(source=BACKWARD_SOURCE.format(ir=str(module), wrt=tuple(wrt)), launch_params={})


def backward_compiles() -> list[tuple[int, ...]]:
    return [wrt for direction, wrt, _ in COMPILED if direction == "bwd"]


# --------------------------------------------------------------------------- helpers


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def qkv(b=1, hq=4, hkv=2, nq=12, nk=20, d=16, dtype=torch.float32, seed=0, grad=True):
    shapes = [(b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)]
    return [rand(*s, dtype=dtype, seed=seed + i).requires_grad_(grad) for i, s in enumerate(shapes)]


def leaves(*tensors, grad=True):
    """Fresh leaf copies (requiring grad if asked) of `tensors`."""
    return [t.detach().clone().requires_grad_(grad) for t in tensors]


@af.variant
def rope_causal(q, k, v):
    q = af.rope(q, theta=10000.0)
    k = af.rope(k, theta=10000.0)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def sinks(q, k, v, sink, window):
    s = af.mask(af.qk(q, k), af.sliding_window(window))
    return af.pv(af.softmax(s, sink=sink), v)


def loss_of(out: torch.Tensor) -> torch.Tensor:
    """A loss whose dout is neither constant nor contiguous-trivial."""
    return (out.float() * torch.linspace(-1, 1, out.shape[-1])).square().sum()


def oracle_grads(variant, args, wrt=None):
    """Float64 autograd of the reference executor: the gradients of `loss_of(out)` with
    respect to the floating-point tensors of `args` (those of `wrt`, indices among the
    tensors, when given)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    xs = [a.detach().double().requires_grad_() if a.is_floating_point() else a for a in tensors]
    out = run_reference(variant.ir_module(*args), *xs, compute_dtype=F64)
    wrt = [i for i, a in enumerate(tensors) if a.is_floating_point()] if wrt is None else wrt
    return dict(zip(wrt, torch.autograd.grad(loss_of(out), [xs[i] for i in wrt]), strict=True))


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().to(F64), b.detach().to(F64)
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def stub_backend():
    """The interpret backend compiling with `compile_with_backward`."""
    return _both(af.backend("interpret"), cache.use_compiler(compile_with_backward))


class _both:
    def __init__(self, *managers):
        self.managers = managers

    def __enter__(self):
        for m in self.managers:
            m.__enter__()

    def __exit__(self, *exc):
        for m in reversed(self.managers):
            m.__exit__(*exc)


# --------------------------------------------------------------------------- the machinery (stand-in compiler)


def test_gradients_flow_through_the_custom_op():
    q, k, v = qkv()
    sink = rand(4, seed=5).requires_grad_()
    with stub_backend():
        out = sinks(q, k, v, sink, 7)
        assert type(out.grad_fn).__name__ == "AttnFuseAttentionBackward"  # the eager twin of the op
        loss_of(out).backward()
    want = oracle_grads(sinks, [q, k, v, sink, 7], wrt=[0, 1, 2, 3])
    for i, x in enumerate((q, k, v, sink)):
        assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == x.dtype
        assert rel_l2(x.grad, want[i]) < 1e-5, i
    assert backward_compiles() == [(0, 1, 2, 3)]


def test_only_inputs_requiring_grad_get_gradients():
    base = qkv(grad=False)
    sink = rand(4, seed=5)
    with stub_backend():
        for wrt in [(0,), (1, 2), (3,), (0, 3)]:
            args = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate((*base, sink))]
            loss_of(sinks(*args, 7)).backward()
            assert [a.grad is not None for a in args] == [i in wrt for i in range(4)]
            sinks(*leaves(*args[:3], grad=False), args[3], 7)  # (the same kernels again)
        # one backward kernel per set of inputs, compiled once, for exactly those
        assert backward_compiles() == [(0,), (1, 2), (3,), (0, 3)]


def test_calls_needing_no_gradient_save_nothing_and_launch_directly(monkeypatch):
    q, k, v = qkv()
    packed: list[torch.Size] = []
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t)
    with stub_backend(), hooks:
        out = rope_causal(q, k, v)  # compiles the forward and the backward kernels
        assert len(packed) == 4 + 1  # q, k, v, out, lse  (+ nothing else)
        packed.clear()
        monkeypatch.setattr(autograd, "attention", None)  # the op is not reached below
        with torch.no_grad():
            assert rope_causal(q, k, v).grad_fn is None
            assert rope_causal.compile(q, k, v)(q, k, v).grad_fn is None
        assert rope_causal(*leaves(q, k, v, grad=False)).grad_fn is None
        assert packed == []
    assert out.grad_fn is not None


def test_backward_kernels_are_cached_with_the_direction_in_their_key(fresh_cache):
    spec = cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 128, 90, False)
    keys = {
        spec.key(),
        cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 128, 90, False, "bwd", (0, 1, 2)).key(),
        cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 128, 90, False, "bwd", (0,)).key(),
    }
    assert len(keys) == 3
    for bad in [dict(direction="sideways"), dict(wrt=(0,)), dict(direction="bwd"), dict(direction="bwd", wrt=(2, 0))]:
        with pytest.raises(ValueError):
            cache.KernelSpec("ir", ("f16",) * 3, (4, 2), (64, 64), 128, 90, False, **bad)  # type: ignore[arg-type]
    # a compile function that knows only the forward still serves forward kernels
    with af.backend("interpret"), cache.use_compiler(stub_compiler.reference_compile):
        rope_causal(*qkv(grad=False))
    q, k, v = qkv()
    with stub_backend():
        loss_of(rope_causal(q, k, v)).backward()
        assert [d for d, _, _ in COMPILED] == ["bwd"]  # the forward kernel was cached above
        entries = sorted(p for p in (fresh_cache / "kernels").glob("*.py"))
        assert len(entries) == 2  # the forward (one entry for both compile functions) and the backward
        grads = [t.grad for t in (q, k, v)]
        runtime.clear_caches()  # both come back from the disk cache
        before = af.runtime.stats()
        q, k, v = leaves(q, k, v)
        loss_of(rope_causal(q, k, v)).backward()
        after = af.runtime.stats()
    assert after["compiles"] == before["compiles"] and after["disk_loads"] == before["disk_loads"] + 2
    for t, g in zip((q, k, v), grads, strict=True):
        torch.testing.assert_close(t.grad, g)


def test_double_backward_is_an_error():
    q, k, v = qkv()
    with stub_backend():
        out = rope_causal(q, k, v)
    (dq,) = torch.autograd.grad(loss_of(out), q, create_graph=True)  # one backward is fine
    with pytest.raises(af.AttnFuseError, match="double backward"):
        dq.square().sum().backward()


def test_lse_is_not_differentiable_and_kernels_are():
    q, k, v = qkv()
    with stub_backend():
        kern = rope_causal.compile(q, k, v)
        out, lse = kern.run_with_lse(q, k, v)
    assert out.grad_fn is not None and not lse.requires_grad
    loss_of(out).backward()
    want = oracle_grads(rope_causal, [q, k, v])
    assert max(rel_l2(t.grad, want[i]) for i, t in enumerate((q, k, v))) < 1e-5


def test_a_gradient_the_compiler_cannot_form_is_a_clear_error():
    q, k, v = qkv()
    slopes = variants.alibi_slopes(4)
    with stub_backend():
        with pytest.raises(af.AttnFuseError, match=r"^slopes requires grad, but the gradient of bloom .*slopes"):
            variants.bloom(q, k, v, slopes.clone().requires_grad_())
        out = variants.bloom(q, k, v, slopes)  # constant slopes: q, k and v are differentiated
        loss_of(out).backward()
        with torch.no_grad():
            variants.bloom(q, k, v, slopes.clone().requires_grad_())
    assert q.grad is not None and v.grad is not None


def test_bf16_on_the_interpreter_runs_the_float32_backward():
    q, k, v = qkv(dtype=torch.bfloat16)
    w = (rand(16, seed=7).abs() + 0.5).to(torch.bfloat16).requires_grad_()
    with stub_backend():
        out = variants.qwen3(q, k, v, w, w)
        loss_of(out).backward()
    assert out.dtype == torch.bfloat16
    ((_, wrt, ir),) = [c for c in COMPILED if c[0] == "bwd"]
    assert wrt == (0, 1, 2, 3, 4) and "bf16" not in ir
    want = oracle_grads(variants.qwen3, [q, k, v, w, w.detach().clone()], wrt=[0, 1, 2, 3, 4])
    for i, t in enumerate((q, k, v)):
        assert t.grad.dtype == torch.bfloat16 and rel_l2(t.grad, want[i]) < 2e-2
    assert w.grad.dtype == torch.bfloat16 and rel_l2(w.grad, want[3] + want[4]) < 2e-2


def test_the_reference_backend_stays_plain_autograd():
    q, k, v = qkv()
    with af.backend("reference"), cache.use_compiler(stub_compiler.failing_compile):
        out = rope_causal(q, k, v)
    assert "attnfuse" not in type(out.grad_fn).__name__
    loss_of(out).backward()
    want = oracle_grads(rope_causal, [q, k, v])
    assert max(rel_l2(t.grad, want[i]) for i, t in enumerate((q, k, v))) < 1e-5


# --------------------------------------------------------------------------- torch.compile


@pytest.fixture
def dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@pytest.mark.parametrize("backend", ["interpret", "reference"])
def test_torch_compile_fullgraph_traces_forward_and_backward(backend, dynamo):
    def step(q, k, v, sink):
        return loss_of(sinks(q, k, v, sink, 7) * 2.0)

    step_compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with af.backend(backend), cache.use_compiler(compile_with_backward):
        for nq, nk in [(12, 20), (30, 30)]:  # the second shape traces again, with a dynamic length
            q, k, v = qkv(nq=nq, nk=nk)
            sink = rand(4, seed=5).requires_grad_()
            step_compiled(q, k, v, sink).backward()
            want = oracle_grads(sinks, [q, k, v, sink, 7], wrt=[0, 1, 2, 3])
            for i, t in enumerate((q, k, v, sink)):
                assert rel_l2(t.grad, 4 * want[i]) < 1e-5, (nq, i)
        with torch.no_grad():
            torch.testing.assert_close(step_compiled(q, k, v, sink), step(q, k, v, sink))
    with af.backend("interpret" if backend == "reference" else "reference"):
        with pytest.raises(af.AttnFuseError, match=f"traced by torch.compile under backend '{backend}'"):
            step_compiled(q, k, v, sink)


def test_torch_compile_fullgraph_with_python_scalars_that_change(dynamo):
    """A Python int (the window) and float (the softcap) argument of the variant: each new
    value is traced again (dynamo guards on it), where it used to make the int symbolic
    and fail with `assume_constant_result argument conversion failed`."""

    @af.variant
    def window_softcap(q, k, v, window, cap):
        return af.pv(af.softmax(af.softcap(af.mask(af.qk(q, k), af.sliding_window(window)), cap)), v)

    def step(q, k, v, window, cap):
        return window_softcap(q, k, v, window, cap) * 2.0

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    q, k, v = qkv(grad=False)
    with af.backend("reference"):
        for window, cap in [(3, 5.0), (5, 5.0), (7, 2.5), (3, 5.0), (20, 0.75)]:
            torch.testing.assert_close(compiled(q, k, v, window, cap), step(q, k, v, window, cap), rtol=0, atol=0)
    outs = {w: step(q, k, v, w, 5.0) for w in (3, 5)}
    assert not torch.equal(outs[3], outs[5])  # the values matter: a stale constant would be caught


def test_gradcheck_in_float64():
    """float64 runs on the reference backend in float64, so torch.autograd.gradcheck
    checks a variant's gradients (q, k, v and a sink)."""
    q, k, v = (t.double().detach().requires_grad_() for t in qkv(b=1, hq=2, hkv=1, nq=5, nk=7, d=4))
    sink = rand(2, seed=9).double().requires_grad_()
    with af.backend("reference"):
        assert torch.autograd.gradcheck(lambda q, k, v: rope_causal(q, k, v), (q, k, v))
        assert torch.autograd.gradcheck(lambda q, k, v, s: sinks(q, k, v, s, 3), (q, k, v, sink))
        out = rope_causal(q, k, v)
    assert out.dtype == F64
    want = run_reference(rope_causal.ir_module(q, k, v), q, k, v, compute_dtype=F64)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_one_compiled_function_for_several_variants(dynamo):
    """The same code traced again for another variant (a recompilation, where torch may
    make changed integers symbolic): each call site names its own variant."""

    @af.variant
    def causal(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    with stub_backend():
        for variant in (rope_causal, causal, rope_causal):
            q, k, v = qkv()
            torch.compile(lambda *a, f=variant: loss_of(f(*a)), fullgraph=True, backend="aot_eager")(q, k, v).backward()
            want = oracle_grads(variant, [q, k, v])
            assert max(rel_l2(t.grad, want[i]) for i, t in enumerate((q, k, v))) < 1e-5, variant.__name__


def test_a_backward_after_clear_caches():
    q, k, v = qkv()
    with stub_backend():
        out = rope_causal(q, k, v)
        runtime.clear_caches()  # forgets the kernels; the autograd graph still holds what it needs
        loss_of(out).backward()
    want = oracle_grads(rope_causal, [q, k, v])
    assert max(rel_l2(t.grad, want[i]) for i, t in enumerate((q, k, v))) < 1e-5


# --------------------------------------------------------------------------- the real compiler's backward

TOL = {torch.float32: 3e-4, torch.float16: 6e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "name,shape",
    [
        ("causal", dict(b=2, hq=4, hkv=2, nq=37, nk=37, d=16)),
        ("llama3", dict(b=1, hq=4, hkv=1, nq=21, nk=64, d=32)),
    ],
)
def test_real_backward_matches_float64_autograd(name, shape, dtype):
    @af.variant
    def causal(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    variant = causal if name == "causal" else variants.llama3
    q, k, v = qkv(dtype=dtype, **shape)
    with af.backend("interpret"):
        loss_of(variant(q, k, v)).backward()
    want = oracle_grads(variant, [q, k, v])
    for i, t in enumerate((q, k, v)):
        assert t.grad.dtype == dtype and rel_l2(t.grad, want[i]) < TOL[dtype], "qkv"[i]


def test_real_backward_only_for_inputs_requiring_grad_and_under_torch_compile(dynamo):
    q, k, v = qkv(nq=16, nk=16, grad=False)
    k.requires_grad_()
    with af.backend("interpret"):
        loss_of(variants.llama3(q, k, v)).backward()
        assert q.grad is None and v.grad is None
        assert rel_l2(k.grad, oracle_grads(variants.llama3, [q, k, v], wrt=[1])[1]) < TOL[torch.float32]
        q, k, v = leaves(q, k, v)
        torch.compile(lambda q, k, v: loss_of(variants.llama3(q, k, v)), fullgraph=True, backend="aot_eager")(
            q, k, v
        ).backward()
    want = oracle_grads(variants.llama3, [q, k, v])
    assert max(rel_l2(t.grad, want[i]) for i, t in enumerate((q, k, v))) < TOL[torch.float32]


def test_real_compiler_refuses_the_gradient_of_alibi_slopes():
    q, k, v = qkv(nq=8, nk=8)
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match="^slopes requires grad"):
        variants.bloom(q, k, v, variants.alibi_slopes(4).requires_grad_())
