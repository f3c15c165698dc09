"""The `triton` backend folder (`attnfuse/targets/triton/`): the prelude's functions as
ordinary code, their copy in every generated module, and the loader of generated source.

`_launch`'s direct-binary path needs a GPU for real (test_gpu.py's repeated launches); here
it runs against stand-ins for Triton's launcher, driver and hooks."""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import attnfuse
from attnfuse import cache
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.targets import get_all_targets
from attnfuse.targets.triton import prelude
from attnfuse.targets.triton.printer import HEADER, TritonTarget, prelude_source

EXAMPLE = Path(attnfuse.__file__).resolve().parent / "examples" / "llama3_rope_causal.mlir"


# ----------------------------------------------------------------------------- the printed prelude


def test_generated_modules_start_with_the_prelude():
    source = compile_module(parse_module(EXAMPLE.read_text()), sm=0).source
    assert source.startswith(HEADER + prelude_source())
    for fn in (prelude._rope_table, prelude._launch):
        assert inspect.getsource(fn) in source
    assert prelude_source().startswith("_TABLES = {}\n")
    assert "# fmt: off" not in prelude_source() and "import torch" not in prelude_source()


def test_target_registry_and_printing_do_not_import_torch():
    code = (
        "import sys\n"
        "from attnfuse.targets import get_all_targets\n"
        "from attnfuse.targets.triton.printer import prelude_source\n"
        "assert get_all_targets()['triton']().name == 'triton'\n"
        "assert prelude_source()\n"
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert get_all_targets()["triton"]() is TritonTarget


# ----------------------------------------------------------------------------- _rope_table


@pytest.fixture
def fresh_prelude(monkeypatch):
    """The prelude's module-level caches, emptied for one test."""
    monkeypatch.setattr(prelude, "_TABLES", {})
    monkeypatch.setattr(prelude, "_BINARIES", {})
    monkeypatch.setattr(prelude, "_DRIVER", [])
    monkeypatch.setattr(prelude, "_PLANS", {})
    return prelude


@pytest.mark.parametrize(
    "like,ordered",
    [
        (torch.zeros(2, 4, 6, 8), False),  # contiguous [B, H, N, D]
        (torch.zeros(2, 6, 4, 8).transpose(1, 2), True),  # Hugging Face's hand-over
        (torch.zeros(2, 6, 1, 8).transpose(1, 2), False),  # one head: either order is contiguous
        (torch.zeros(2, 1, 4, 8).transpose(1, 2), False),  # one row: likewise
        (torch.zeros(2, 4, 8, 6).transpose(2, 3), False),  # heads outer, other strides odd
    ],
    ids=["contiguous", "bnhd-view", "one-head", "one-row", "d-not-inner"],
)
def test_empty_ordered_follows_the_heads_and_sequence_order_of_like(like, ordered):
    shape = (like.shape[0], 3, like.shape[2], 5)  # its own heads and head dim
    out = prelude._empty_ordered(like, shape, torch.float16, "cpu")
    assert out.shape == shape and out.dtype == torch.float16
    if ordered:  # [B, N, H, D] storage
        assert out.transpose(1, 2).is_contiguous() and not out.is_contiguous()
    else:
        assert out.is_contiguous()


@pytest.mark.parametrize("length,rows", [(0, 1), (1, 1), (5, 8), (8, 8), (9, 16), (1000, 1024)])
def test_rope_table_rows_are_the_next_power_of_two(fresh_prelude, length, rows):
    cos, sin = fresh_prelude._rope_table("k", [1.0, 0.25], length, 1.0, "cpu")
    assert cos.shape == sin.shape == (rows, 2)
    assert cos.dtype == sin.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous()


def test_rope_table_values_and_reuse(fresh_prelude):
    inv_freq, magnitude = [1.0, 0.1, 0.01], 1.25
    cos, sin = fresh_prelude._rope_table("q", inv_freq, 20, magnitude, "cpu")
    for pos in (0, 1, 7, 31):
        for j, f in enumerate(inv_freq):
            assert cos[pos, j].item() == pytest.approx(magnitude * math.cos(pos * f), rel=1e-6, abs=1e-6)
            assert sin[pos, j].item() == pytest.approx(magnitude * math.sin(pos * f), rel=1e-6, abs=1e-6)
    # Built once per key, device and length bucket: lengths 17..32 share the table.
    again = fresh_prelude._rope_table("q", inv_freq, 32, magnitude, "cpu")
    assert again[0] is cos and again[1] is sin
    assert fresh_prelude._rope_table("q", inv_freq, 33, magnitude, "cpu")[0].shape[0] == 64
    assert fresh_prelude._rope_table("k", inv_freq, 20, magnitude, "cpu")[0] is not cos
    assert len(fresh_prelude._TABLES) == 3


# ----------------------------------------------------------------------------- _launch


class FakeBinary:
    """What Triton's launcher returns: a compiled kernel with `run`."""

    def __init__(self, runs: list, function: object = "cufunction"):
        self.function, self.packed_metadata, self.runs = function, "metadata", runs

    def run(self, *args):
        self.runs.append(args)


class FakeJIT:
    """A `@triton.jit` function: `kernel[grid](*args, num_warps=, num_stages=)` records the
    call (Triton's own path) and returns a binary."""

    def __init__(self, function: object = "cufunction"):
        self.launches: list = []
        self.runs: list = []
        self.function = function

    def __getitem__(self, grid):
        def launch(*args, num_warps, num_stages):
            self.launches.append((grid, args, num_warps, num_stages))
            return FakeBinary(self.runs, self.function)

        return launch


@pytest.fixture
def fake_triton(fresh_prelude, monkeypatch):
    """Triton as the prelude sees it: FakeJIT is the JIT function type, device 3, stream
    'stream-of-3', no launch hooks."""
    runtime = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[]), launch_exit_hook=SimpleNamespace(calls=[]))
    active = SimpleNamespace(get_current_device=lambda: 3, get_current_stream=lambda device: f"stream-of-{device}")
    fake = SimpleNamespace(
        knobs=SimpleNamespace(runtime=runtime),
        runtime=SimpleNamespace(JITFunction=FakeJIT, driver=SimpleNamespace(active=active)),
    )
    monkeypatch.setattr(fresh_prelude, "triton", fake)
    return fake


def test_launch_runs_the_binary_directly_after_the_first_launch(fake_triton):
    kernel = FakeJIT()
    x = torch.zeros(64, dtype=torch.float16)
    prelude._launch(kernel, (4, 2), 8, 3, x, 100)
    assert kernel.launches == [((4, 2), (x, 100), 8, 3)] and kernel.runs == []
    y = torch.ones(64, dtype=torch.float16)  # another tensor, same dtype and alignment
    prelude._launch(kernel, (5, 2), 8, 3, y, 100)
    assert len(kernel.launches) == 1
    # Tensors go to the binary as their data pointers.
    assert kernel.runs == [(5, 2, 1, "stream-of-3", "cufunction", "metadata", None, None, None, y.data_ptr(), 100)]
    # New specialisations go through Triton's launcher again: another integer argument,
    # a data pointer off a 16-byte boundary, another dtype, other launch options.
    prelude._launch(kernel, (4, 2), 8, 3, x, 101)
    prelude._launch(kernel, (4, 2), 8, 3, x[1:], 100)
    prelude._launch(kernel, (4, 2), 8, 3, x.float(), 100)
    prelude._launch(kernel, (4, 2), 4, 3, x, 100)
    assert len(kernel.launches) == 5 and len(kernel.runs) == 1
    prelude._launch(kernel, (7,), 8, 3, x, 101)
    assert kernel.runs[-1][:3] == (7, 1, 1) and len(kernel.launches) == 5


def test_launch_key_follows_each_kernels_argument_kinds(fake_triton):
    """The key reads a kernel's tensors and other arguments by position (its plan, made at its
    first launch); a call whose kinds differ takes Triton's path instead of a wrong binary."""
    kernel, other = FakeJIT(), FakeJIT()
    x = torch.zeros(64, dtype=torch.float16)
    prelude._launch(kernel, (1,), 4, 1, x, 7, x)
    prelude._launch(kernel, (1,), 4, 1, x.clone(), 7, x.clone())
    assert len(kernel.launches) == 1 and len(kernel.runs) == 1
    prelude._launch(kernel, (1,), 4, 1, 5, 7, x)  # an int where a tensor was
    assert len(kernel.launches) == 2 and len(kernel.runs) == 1
    prelude._launch(other, (1,), 4, 1, 7, x)  # another kernel, its own plan
    prelude._launch(other, (1,), 4, 1, 7, x.clone())
    assert len(other.launches) == 1 and len(other.runs) == 1
    prelude._launch(other, (1,), 4, 1, 8, x)  # another integer: another binary
    assert len(other.launches) == 2


class FakeLauncher:
    """Triton's launcher object (`binary.run`): its C launcher (`launch`, of the module Triton
    builds it in) and the scratch memory its binary needs."""

    def __init__(self, calls: list, scratch: int):
        self.calls, self.global_scratch_size, self.profile_scratch_size = calls, scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True

        def launch(*args):
            calls.append(("c", args))

        launch.__module__ = "__triton_launcher"
        self.launch = launch

    def __call__(self, *args):
        self.calls.append(("object", args))


@pytest.mark.parametrize("scratch", [0, 256])
def test_launch_calls_the_c_launcher_itself_when_the_binary_needs_no_scratch(fake_triton, scratch):
    calls: list = []

    class Binary:
        function, packed_metadata, run = "cufunction", "metadata", FakeLauncher(calls, scratch)

    class JIT(FakeJIT):
        def __getitem__(self, grid):
            return lambda *args, num_warps, num_stages: Binary()

    fake_triton.runtime.JITFunction = JIT
    kernel, x = JIT(), torch.zeros(64, dtype=torch.float16)
    prelude._launch(kernel, (4, 2), 8, 3, x, 100)
    prelude._launch(kernel, (4, 2), 8, 3, x, 100)
    head = (4, 2, 1, "stream-of-3", "cufunction")
    if scratch:  # the launcher object, which allocates the scratch
        assert calls == [("object", (*head, "metadata", None, None, None, x.data_ptr(), 100))]
    else:  # cooperative grid, PDL, no global or profile scratch, then as the launcher object
        assert calls == [("c", (*head, False, True, None, None, "metadata", None, None, None, x.data_ptr(), 100))]


def test_launch_takes_tritons_path_with_hooks_interpreted_kernels_and_no_binary(fake_triton):
    x = torch.zeros(8)
    fake_triton.knobs.runtime.launch_enter_hook.calls.append(print)
    hooked = FakeJIT()
    for _ in range(3):
        prelude._launch(hooked, (1,), 4, 1, x)
    assert len(hooked.launches) == 3 and hooked.runs == []
    fake_triton.knobs.runtime.launch_enter_hook.calls.clear()

    class Interpreted(FakeJIT):  # not exactly the JIT function type: Triton's path
        pass

    interpreted, unbound = Interpreted(), FakeJIT(function=None)
    for _ in range(3):
        prelude._launch(interpreted, (1,), 4, 1, x)
        prelude._launch(unbound, (1,), 4, 1, x)  # a binary without a function is not kept
    assert len(interpreted.launches) == len(unbound.launches) == 3
    assert interpreted.runs == unbound.runs == [] and prelude._BINARIES == {}


# ----------------------------------------------------------------------------- the loader


def test_load_source_writes_and_imports_each_text_once(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    text = (
        "import os\nMODE = os.environ.get('TRITON_INTERPRET')\n"
        "COUNT = [0]\ndef launch(*args):\n    COUNT[0] += 1\n    return args, None\n"
    )
    first = cache.load_source(text, tmp_path, interpret=True)
    assert cache.load_source(text, tmp_path, interpret=True) is first
    compiled = cache.load_source(text, tmp_path, interpret=False)
    assert compiled is not first
    assert (first.MODE, compiled.MODE) == ("1", "0") and "TRITON_INTERPRET" not in os.environ
    (path,) = tmp_path.glob("attnfuse_*.py")
    assert path.read_text() == text and Path(first.__file__) == path
    other = cache.load_source(text + "\n", tmp_path, interpret=True)
    assert other is not first and len(list(tmp_path.glob("attnfuse_*.py"))) == 2


def test_load_module_rejects_a_module_without_launch(tmp_path):
    path = tmp_path / "no_launch.py"
    path.write_text("X = 1\n")
    with pytest.raises(RuntimeError, match="defines no launch"):
        cache.load_module(path, interpret=True)


def test_interpreted_modules_skip_the_overflow_checks_that_the_interpreter_drops(tmp_path, monkeypatch):
    """Loading a module for the interpreter turns off the int32 overflow checks' arithmetic,
    whose assert the interpreter drops (debug off), and leaves them where it would run."""
    from triton.runtime import interpreter

    path = tmp_path / "kernel.py"
    path.write_text("def launch():\n    pass\n")
    builder = interpreter.interpreter_builder
    for debug, kept in ((False, False), (True, True)):
        monkeypatch.setattr(builder, "options", interpreter.InterpreterOptions(debug=debug))
        cache.load_module(path, interpret=True, name=f"overflow_checks_{debug}")
        assert builder.options.sanitize_overflow is kept and builder.options.debug is debug
    monkeypatch.setattr(builder, "options", interpreter.InterpreterOptions())
    cache.load_module(path, interpret=False, name="overflow_checks_compiled")
    assert builder.options.sanitize_overflow  # compiled kernels: Triton's own options


def test_a_launch_that_needs_too_much_shared_memory_takes_fewer_stages():
    """The generated `_launch` retries with fewer pipeline stages where Triton says the kernel
    needs more shared memory than the GPU has (seen on the H200: a custom-mask fallback kernel
    at 3 stages asked for 352 KB), remembers what fit, and lets any other shortage through."""
    from triton.runtime.errors import OutOfResources

    class Kernel:
        """Stands for a compiled kernel that fits only with `fits` stages or fewer."""

        def __init__(self, fits: int, resource: str = "shared memory"):
            self.fits, self.resource, self.tried = fits, resource, []

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages):
                self.tried.append(num_stages)
                if num_stages > self.fits:
                    raise OutOfResources(360448, 232448, self.resource)
                return ("binary", num_stages)

            return run

    kernel = Kernel(fits=1)
    assert prelude._launch(kernel, (1,), 8, 3, 0.5) == ("binary", 1)
    assert kernel.tried == [3, 2, 1]
    kernel.tried.clear()
    assert prelude._launch(kernel, (1,), 8, 3, 0.5) == ("binary", 1)
    assert kernel.tried == [1], "the stages that fit are remembered"
    with pytest.raises(OutOfResources, match="registers"):
        prelude._launch(Kernel(fits=1, resource="registers"), (1,), 8, 3, 0.5)
    with pytest.raises(OutOfResources, match="shared memory"):
        prelude._launch(Kernel(fits=0), (1,), 8, 2, 0.5)
