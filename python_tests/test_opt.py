"""`attnfuse-opt`: parsing and printing attn IR, the custom <-> generic round trip,
diagnostics for malformed IR, and `--version`.

Most tests call `attnfuse.tools.opt.main(args=[...])` in-process; a few run the
installed console script to check real exit codes and stderr.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin, FloatAttr, ModuleOp, f64
from xdsl.dialects.func import Func
from xdsl.dialects.math import Math
from xdsl.parser import Parser

from attnfuse.dialects.attn import Attn, NormOp, RopeOp, ScaleOp
from attnfuse.tools.opt import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "attnfuse" / "examples" / "llama3_rope_causal.mlir"
# The lit round-trip files (not the *_invalid ones) cover every op and attribute form.
ROUNDTRIP_FILES = sorted(
    p for p in (ROOT / "lit_tests" / "dialects" / "attn").glob("*.mlir") if not p.stem.endswith("_invalid")
)

GQA_SOFTCAP = """
func.func @f(%q: tensor<?x4x?x16xf32>, %k: tensor<?x2x?x16xf32>, %v: tensor<?x2x?x16xf32>) -> tensor<?x4x?x16xf32> {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x2x?x16xf32> -> !attn.scores<4>
  %c = attn.softcap %s cap = 20.0 : !attn.scores<4>
  %p = attn.softmax %c : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x16xf32> -> tensor<?x4x?x16xf32>
  func.return %o : tensor<?x4x?x16xf32>
}
"""

BAD_HEADS = """
func.func @f(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4>
  func.return
}
"""

BAD_SYNTAX = """
func.func @f(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap 20.0 : !attn.scores<4>
  func.return
}
"""


def run_opt(capsys: pytest.CaptureFixture[str], *args: str | Path) -> str:
    """stdout of `attnfuse-opt args...` run in-process; it must succeed."""
    main(args=[str(a) for a in args])
    out, _ = capsys.readouterr()
    return out


def write(tmp_path: Path, text: str, name: str = "in.mlir") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def context() -> Context:
    ctx = Context()
    for dialect in (Builtin, Func, Arith, Math, Attn):
        ctx.load_dialect(dialect)
    return ctx


def parse(text: str) -> ModuleOp:
    module = Parser(context(), text).parse_module()
    module.verify()
    return module


# --------------------------------------------------------------------------- parse and print


def test_prints_the_example_in_custom_form(capsys):
    out = run_opt(capsys, EXAMPLE)
    assert out.startswith("builtin.module {\n  func.func @llama3(")
    for line in (
        "%m = attn.mask %s causal : !attn.scores<32>",
        "%p = attn.softmax %m : !attn.scores<32> -> !attn.probs<32>",
        "%o = attn.pv %p, %v : !attn.probs<32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>",
    ):
        assert line in out
    ops = [op.name for op in parse(out).walk()]
    assert ops.count("attn.rope") == 2
    assert ops[-2:] == ["attn.pv", "func.return"]


def test_custom_print_is_a_fixpoint(capsys, tmp_path):
    once = run_opt(capsys, write(tmp_path, GQA_SOFTCAP))
    twice = run_opt(capsys, write(tmp_path, once, "again.mlir"))
    assert once == twice


def test_generic_form_is_generic(capsys, tmp_path):
    generic = run_opt(capsys, write(tmp_path, GQA_SOFTCAP), "--print-op-generic")
    attn_lines = [line for line in generic.splitlines() if "attn." in line and "=" in line]
    assert len(attn_lines) == 4
    assert all('= "attn.' in line for line in attn_lines)
    assert '"attn.softcap"(%s) <{cap = 2.000000e+01 : f64}>' in generic


@pytest.mark.parametrize("path", ROUNDTRIP_FILES, ids=lambda p: p.name)
def test_generic_round_trip_prints_the_same_module(capsys, tmp_path, path):
    """custom -> generic -> custom gives back the very text of custom -> custom,
    and the generic and custom texts parse to structurally equal modules."""
    custom = run_opt(capsys, path, "--split-input-file")
    generic = run_opt(capsys, path, "--split-input-file", "--print-op-generic")
    again = run_opt(capsys, write(tmp_path, generic), "--split-input-file")
    assert again == custom
    for c, g in zip(custom.split("// -----\n"), generic.split("// -----\n"), strict=True):
        assert parse(c).is_structurally_equivalent(parse(g))


def test_round_trip_files_cover_every_attn_op():
    seen = {
        op.name
        for path in ROUNDTRIP_FILES
        for chunk in path.read_text().split("// -----")
        for op in parse(chunk).walk()
    }
    assert {op.name for op in Attn.operations} <= seen


@settings(max_examples=60, deadline=None)
@given(
    value=st.floats(allow_nan=False, allow_infinity=False),
    eps=st.floats(min_value=1e-300, max_value=1e300),
)
def test_floats_print_and_read_back_exactly(value, eps):
    """Every finite float, with or without an exponent, survives custom printing."""
    module = parse(
        "func.func @f(%q: tensor<?x2x?x8xf32>) {\n"
        "  %a = attn.scale %q value = 1.0 : tensor<?x2x?x8xf32>\n"
        "  %b = attn.norm %a eps = 1.0 : tensor<?x2x?x8xf32>\n"
        "  %c = attn.rope %b half theta = 1.0 rotary_dim = 8 : tensor<?x2x?x8xf32>\n"
        "  func.return\n}\n"
    )
    scale, norm, rope = (op for op in module.walk() if op.name.startswith("attn."))
    assert isinstance(scale, ScaleOp) and isinstance(norm, NormOp) and isinstance(rope, RopeOp)
    scale.value = FloatAttr(value, f64)
    norm.eps = FloatAttr(eps, f64)
    rope.theta = FloatAttr(eps, f64)
    again = [op for op in parse(str(module)).walk() if op.name.startswith("attn.")]
    assert again[0].value.value.data == value
    assert math.copysign(1.0, again[0].value.value.data) == math.copysign(1.0, value)
    assert again[1].eps.value.data == eps
    assert again[2].theta.value.data == eps


def test_split_input_file_keeps_chunks_apart(capsys, tmp_path):
    out = run_opt(capsys, write(tmp_path, GQA_SOFTCAP + "// -----\n" + GQA_SOFTCAP), "--split-input-file")
    chunks = out.split("// -----\n")
    assert len(chunks) == 2 and chunks[0] == chunks[1]


# --------------------------------------------------------------------------- diagnostics


def test_verifier_error_exits_non_zero_with_the_rule(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(args=[str(write(tmp_path, BAD_HEADS))])
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("attnfuse-opt: error: attn.qk q heads (4) must be a multiple of k heads (3)\n")
    assert "Traceback" not in err


def test_syntax_error_names_the_place(capsys, tmp_path):
    path = write(tmp_path, BAD_SYNTAX)
    with pytest.raises(SystemExit) as exit_info:
        main(args=[str(path)])
    assert exit_info.value.code == 1
    _, err = capsys.readouterr()
    assert err.startswith(f"attnfuse-opt: error: {path}:3:")
    assert "Expected '='" in err


def test_verify_diagnostics_reports_and_exits_zero(capsys, tmp_path):
    path = write(tmp_path, BAD_HEADS + "// -----\n" + GQA_SOFTCAP)
    out = run_opt(capsys, path, "--split-input-file", "--verify-diagnostics")
    first, second = out.split("// -----\n")
    assert first.startswith("attn.qk q heads (4) must be a multiple of k heads (3)\n")
    assert second.startswith("builtin.module {")


def test_unknown_pass_is_a_diagnostic(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(args=[str(write(tmp_path, GQA_SOFTCAP)), "-p", "no-such-pass"])
    assert exit_info.value.code == 1
    assert "Unrecognized passes: ['no-such-pass']" in capsys.readouterr().err


def test_console_script_reports_malformed_ir_without_traceback():
    """The installed `attnfuse-opt` reads stdin; bad IR gives exit 1 and one message."""
    exe = shutil.which("attnfuse-opt", path=str(Path(sys.executable).parent))
    assert exe is not None, "the attnfuse-opt console script is not installed beside this Python"
    bad = subprocess.run([exe], input=BAD_HEADS, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert "attn.qk q heads (4) must be a multiple of k heads (3)" in bad.stderr
    assert "Traceback" not in bad.stderr
    good = subprocess.run([exe], input=GQA_SOFTCAP, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert "attn.softcap %s cap = 20.0 : !attn.scores<4>" in good.stdout


# --------------------------------------------------------------------------- --version


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args=["--version"])
    assert exit_info.value.code == 0
    out, _ = capsys.readouterr()
    assert out.strip() == f"attnfuse-opt {version('attnfuse')} (xdsl {version('xdsl')})"
