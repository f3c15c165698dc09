"""The compiler driver's per-stage IR dump (`compile_module(dump_ir=...)` and
`ATTNFUSE_DUMP_IR`): a file per stage of `attnfuse.pipeline.STAGES`, each reading back,
plus the generated Triton source; the runtime's compile path honours the variable, on a
disk-cache hit too, and the reference backend says once that it dumps nothing. A dump
that cannot be written: an error for `dump_ir`, one warning for the variable."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from xdsl.parser import Parser

import attnfuse as af
from attnfuse import cache, compiler, runtime
from attnfuse.compiler import DUMP_IR_ENV, compile_module
from attnfuse.dialects.tl import TL
from attnfuse.errors import AttnFuseError
from attnfuse.ir import make_context, parse_module
from attnfuse.pipeline import STAGES

VARIANT = """\
func.func @rope_causal(%q: tensor<?x4x?x16xf32>, %k: tensor<?x2x?x16xf32>, %v: tensor<?x2x?x16xf32>)
    -> tensor<?x4x?x16xf32> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 16 : tensor<?x4x?x16xf32>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 16 : tensor<?x2x?x16xf32>
  %s = attn.qk %qr, %kr : tensor<?x4x?x16xf32>, tensor<?x2x?x16xf32> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x16xf32> -> tensor<?x4x?x16xf32>
  func.return %o : tensor<?x4x?x16xf32>
}
"""

STAGE_NAMES = [name for name, _ in STAGES]


@pytest.fixture(autouse=True)
def no_dump_variable(monkeypatch):
    monkeypatch.delenv(DUMP_IR_ENV, raising=False)


def reparse(path: Path):
    """Parse a dumped stage back, with the tl dialect too (the last stage is tl IR)."""
    ctx = make_context()
    ctx.load_dialect(TL)
    module = Parser(ctx, path.read_text(), str(path)).parse_module()
    module.verify()
    return module


def test_every_stage_is_written_named_by_the_stage_table_and_reads_back(tmp_path):
    compiled = compile_module(parse_module(VARIANT), sm=0, dump_ir=tmp_path / "dump")
    files = sorted(p.name for p in (tmp_path / "dump").iterdir())
    forward = STAGE_NAMES[1:]  # attn-autodiff runs only for the backward
    assert files == [
        "00-input.mlir",
        *(f"{i:02d}-{name}.mlir" for i, name in enumerate(forward, 1)),
        f"{len(forward) + 1:02d}-triton.py",
    ]
    assert STAGE_NAMES == [
        "attn-autodiff",
        "kernel-path",
        "rope-fusion",
        "causal-split",
        "tiling",
        "convert-attn-to-tl",
    ]
    modules = {name: reparse(tmp_path / "dump" / name) for name in files if name.endswith(".mlir")}
    assert modules["00-input.mlir"].is_structurally_equivalent(parse_module(VARIANT))
    # Each stage leaves its mark: tiling adds attn.tiling; the last stage is tl only.
    assert "attn.kernel_path" in (tmp_path / "dump" / "01-kernel-path.mlir").read_text()
    assert "attn.tiling" not in (tmp_path / "dump" / "03-causal-split.mlir").read_text()
    assert "attn.tiling" in (tmp_path / "dump" / "04-tiling.mlir").read_text()
    last = modules["05-convert-attn-to-tl.mlir"]
    assert {op.dialect_name() for op in last.walk()} <= {"builtin", "tl"}
    assert (tmp_path / "dump" / "06-triton.py").read_text() == compiled.source


def test_the_backward_dumps_the_autodiff_stage_first(tmp_path):
    compiled = compile_module(parse_module(VARIANT), sm=0, direction="bwd", dump_ir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [
        "00-input.mlir",
        *(f"{i:02d}-{name}.mlir" for i, name in enumerate(STAGE_NAMES, 1)),
        f"{len(STAGES) + 1:02d}-triton.py",
    ]
    assert "attn.qk_grad" in (tmp_path / "01-attn-autodiff.mlir").read_text()
    assert "def attn_bwd_dkdv(" in compiled.source and "def attn_bwd_dq(" in compiled.source


def test_a_skipped_stage_writes_no_file(tmp_path):
    compile_module(parse_module(VARIANT), sm=0, causal_split=False, dump_ir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00-input.mlir",
        "01-kernel-path.mlir",
        "02-rope-fusion.mlir",
        "03-tiling.mlir",
        "04-convert-attn-to-tl.mlir",
        "05-triton.py",
    ]


def test_a_failing_stage_leaves_the_stages_before_it(tmp_path):
    k_twice = VARIANT.replace(
        "  %kr = attn.rope %k half",
        "  %k1 = attn.rope %k half theta = 500.0 rotary_dim = 16 : tensor<?x2x?x16xf32>\n  %kr = attn.rope %k1 half",
    )
    with pytest.raises(Exception, match="at most one attn.rope"):
        compile_module(parse_module(k_twice), sm=0, dump_ir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00-input.mlir",
        "01-kernel-path.mlir",
        "02-rope-fusion.mlir",
        "03-causal-split.mlir",
        "04-tiling.mlir",
    ]


def test_no_dump_without_the_switch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    compile_module(parse_module(VARIANT), sm=0)
    assert list(tmp_path.iterdir()) == []


def test_the_environment_variable_gives_each_compilation_its_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(DUMP_IR_ENV, str(tmp_path))
    module = parse_module(VARIANT)
    compile_module(module, sm=0)
    compile_module(module, sm=0)  # the same compilation: the same folder, rewritten
    compile_module(module, sm=0, block_m=16)  # other options: another folder
    folders = sorted(tmp_path.iterdir())
    assert len(folders) == 2
    assert all(f.name.startswith("rope_causal-") for f in folders)
    for folder in folders:
        assert len(list(folder.glob("*.mlir"))) == len(STAGES)  # input and the forward stages
        assert len(list(folder.glob("*-triton.py"))) == 1


@af.variant
def plain(q, k, v):
    return af.pv(af.softmax(af.qk(q, k)), v)


def test_the_runtime_compile_path_honours_the_environment_variable(tmp_path, monkeypatch):
    """`af` compiles on a cache miss through `compile_module`, which reads the variable
    at each compilation; a kernel loaded from the disk cache is compiled once more, for
    its dump."""
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(DUMP_IR_ENV, str(tmp_path / "dump"))
    runtime.clear_caches()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    try:
        with af.backend("interpret"):
            plain.compile(q, k, v)
        (folder,) = (tmp_path / "dump").iterdir()
        assert folder.name.startswith("plain-")
        files = sorted(p.name for p in folder.iterdir())
        assert files[-1] == f"{len(STAGES):02d}-triton.py"
        for path in folder.glob("*.mlir"):
            reparse(path)
        dumped = {name: (folder / name).read_text() for name in files}
        for path in folder.iterdir():
            path.unlink()
        runtime.clear_caches()  # the next call loads the kernel from the disk cache
        before = runtime.stats()
        with af.backend("interpret"):
            plain.compile(q, k, v)
        after = runtime.stats()
        assert (after["compiles"], after["disk_loads"]) == (before["compiles"], before["disk_loads"] + 1)
        assert {p.name: p.read_text() for p in folder.iterdir()} == dumped
    finally:
        runtime.clear_caches()


def reference_warnings(monkeypatch) -> list[str]:
    """The RuntimeWarnings of two reference calls of a new variant (two signatures) in a
    process that has not warned yet."""
    monkeypatch.setattr(cache, "_reference_warned", False)
    fresh = af.variant(plain.fn)
    with warnings.catch_warnings(record=True) as caught, af.backend("reference"):
        warnings.simplefilter("always")
        for n in (8, 9):
            fresh(*(torch.randn(1, 2, n, 16) for _ in range(3)))
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_the_reference_backend_warns_once_that_it_dumps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(DUMP_IR_ENV, str(tmp_path / "dump"))
    (message,) = reference_warnings(monkeypatch)
    assert message.startswith(f"{DUMP_IR_ENV} is set, but the reference backend compiles nothing")
    assert "'interpret'" in message
    assert not (tmp_path / "dump").exists()


def test_the_reference_backend_is_quiet_without_the_variable(monkeypatch):
    assert reference_warnings(monkeypatch) == []


def blocked(tmp_path: Path) -> Path:
    """A path under a regular file: no folder can be made there."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "dumps"


def test_an_unwritable_dump_variable_warns_once_naming_it_and_compiles_on(tmp_path, monkeypatch):
    monkeypatch.setenv(DUMP_IR_ENV, str(blocked(tmp_path)))
    monkeypatch.setattr(compiler, "_unwritable_dumps", set())
    module = parse_module(VARIANT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dumped = compile_module(module, sm=0)
        compile_module(module, sm=0, block_m=16)  # another folder under the same variable: no second warning
    (warning,) = caught
    assert issubclass(warning.category, RuntimeWarning)
    message = str(warning.message)
    assert message.startswith(f"{DUMP_IR_ENV}='{blocked(tmp_path)}': cannot write the IR dump {blocked(tmp_path)}/")
    assert "Not a directory" in message
    monkeypatch.delenv(DUMP_IR_ENV)
    assert dumped.source == compile_module(module, sm=0).source


@pytest.mark.parametrize("where", ["folder", "file"])
def test_an_unwritable_dump_ir_argument_is_an_error_naming_it(tmp_path, where):
    if where == "folder":
        folder, path = blocked(tmp_path), blocked(tmp_path)
    else:
        folder = tmp_path / "dump"
        path = folder / "00-input.mlir"
        path.mkdir(parents=True)  # the first file cannot be written
    with pytest.raises(AttnFuseError, match=f"cannot write the IR dump {re.escape(str(path))}: "):
        compile_module(parse_module(VARIANT), sm=0, dump_ir=folder)


def test_the_variable_s_folder_may_start_with_a_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(DUMP_IR_ENV, "~/dumps")
    monkeypatch.chdir(tmp_path)
    compile_module(parse_module(VARIANT), sm=0)
    (folder,) = (tmp_path / "home" / "dumps").iterdir()
    assert folder.name.startswith("rope_causal-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_invalid_input_is_refused_before_any_stage(tmp_path):
    bad = parse_module(VARIANT)
    func = next(iter(bad.ops))
    ops = list(func.walk())
    softmax = next(op for op in ops if op.name == "attn.softmax")
    pv = next(op for op in ops if op.name == "attn.pv")
    softmax.detach()
    pv.parent_block().insert_op_after(softmax, pv)  # now pv reads the softmax before it runs
    with pytest.raises(AttnFuseError, match="before its definition"):
        compile_module(bad, sm=0, dump_ir=tmp_path)
    assert list(tmp_path.iterdir()) == []
