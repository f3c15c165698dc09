"""The compiler driver's per-stage IR dump (`compile_module(dump_ir=...)` and
`ATTNFUSE_DUMP_IR`): a file per stage of `attnfuse.pipeline.STAGES`, each reading back,
plus the generated Triton source; the runtime's compile path honours the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from xdsl.parser import Parser

import attnfuse as af
from attnfuse import runtime
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


def test_the_runtime_compile_path_honours_the_environment_variable(tmp_path, monkeypatch):
    """`af` compiles on a cache miss through `compile_module`, which reads the variable
    at each compilation; a cache hit compiles nothing, so dumps nothing."""
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(DUMP_IR_ENV, str(tmp_path / "dump"))
    runtime.clear_caches()

    @af.variant
    def plain(q, k, v):
        return af.pv(af.softmax(af.qk(q, k)), v)

    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    try:
        with af.backend("interpret"):
            plain.compile(q, k, v)
        (folder,) = (tmp_path / "dump").iterdir()
        assert folder.name.startswith("plain-")
        assert sorted(p.name for p in folder.iterdir())[-1] == f"{len(STAGES):02d}-triton.py"
        for path in folder.glob("*.mlir"):
            reparse(path)
    finally:
        runtime.clear_caches()


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
