"""`attnfuse-opt`: parsing and printing attn IR, the custom <-> generic round trip,
diagnostics for malformed IR, and `--version`.

Most tests call `attnfuse.tools.opt.main(args=[...])` in-process; a few run the
installed console script to check real exit codes and stderr.
"""

from __future__ import annotations

import io
import math
import re
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


@settings(max_examples=60, deadline=None, derandomize=True)
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


def test_verify_diagnostics_without_annotations_prints_for_filecheck(capsys, tmp_path):
    """An input without expected-error annotations keeps xdsl-opt's meaning: each
    chunk's diagnostic is printed on stdout, and the exit status is 0."""
    path = write(tmp_path, BAD_HEADS + "// -----\n" + GQA_SOFTCAP)
    out = run_opt(capsys, path, "--split-input-file", "--verify-diagnostics")
    first, second = out.split("// -----\n")
    assert first.startswith("attn.qk q heads (4) must be a multiple of k heads (3)\n")
    assert second.startswith("builtin.module {")


def failing_run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[str, str]:
    """(stdout, stderr) of `attnfuse-opt args...` run in-process; it must exit with 1."""
    with pytest.raises(SystemExit) as exit_info:
        main(args=[str(a) for a in args])
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return out, err


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ("no-such-pass", "unknown pass 'no-such-pass' (--help lists the passes)"),
        ("tiling{block-m=64", "column 18: Malformed pass arguments, expected either a space or `}` here"),
        (",", "column 1: Expected pass name here"),
        ("tiling,,causal-split", "column 8: Expected pass name here"),
        ("tiling{block-m=abc}", "pass 'tiling': Incompatible types: given ('abc',), expected int | None"),
        ("tiling{no-such-option=1}", "pass 'tiling': Provided arguments [\"no_such_option\"] not found"),
    ],
)
def test_a_bad_pass_pipeline_is_one_line(capsys, tmp_path, pipeline, message):
    """Issue 10 item 11: not a 31-line traceback (ArgSpecParseError is a BaseException)."""
    _, err = failing_run(capsys, write(tmp_path, GQA_SOFTCAP), "-p", pipeline)
    assert err.startswith(f"attnfuse-opt: error: pass pipeline '{pipeline}': {message}")
    assert err.count("\n") == 1


def test_input_nested_too_deeply_is_one_line(capsys, tmp_path):
    """Issue 10 item 11: not a 3000-line RecursionError."""
    depth = 2000
    text = "func.func @f() {\n" + '"test.op"() ({\n' * depth + "}) : () -> ()\n" * depth + "func.return\n}\n"
    _, err = failing_run(capsys, write(tmp_path, text), "--allow-unregistered-dialect")
    assert err == (
        f"attnfuse-opt: error: the input is nested too deeply (Python's recursion limit, "
        f"{sys.getrecursionlimit()}, was reached)\n"
    )


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


# --------------------------------------------------------------------------- --split-input-file, --verify-diagnostics

BAD_CAP = """
func.func @g(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = -1.0 : !attn.scores<4>
  func.return
}
"""


def test_split_input_file_reports_every_failing_chunk_and_goes_on(capsys, tmp_path):
    """Issue 10 item 13: xDSL stopped at the first failing chunk."""
    path = write(tmp_path, BAD_HEADS + "// -----\n" + GQA_SOFTCAP + "// -----\n" + BAD_CAP + "// -----\n" + GQA_SOFTCAP)
    out, err = failing_run(capsys, path, "--split-input-file")
    chunks = out.split("// -----\n")
    assert len(chunks) == 4
    assert chunks[0] == chunks[2] == ""
    assert chunks[1] == chunks[3] and "attn.softcap %s cap = 20.0" in chunks[1]
    errors = [line for line in err.splitlines() if line.startswith("attnfuse-opt: error:")]
    assert errors == [
        "attnfuse-opt: error: attn.qk q heads (4) must be a multiple of k heads (3)",
        "attnfuse-opt: error: attn.softcap cap must be > 0 and finite, got -1.0",
    ]


def annotated(text: str, line: str, annotation: str) -> str:
    """`text` with `// <annotation>` appended to the line containing `line`."""
    return "\n".join(f"{t} // {annotation}" if line in t else t for t in text.split("\n"))


def test_verify_diagnostics_passes_when_the_annotations_are_met(capsys, tmp_path):
    bad = annotated(BAD_HEADS, "attn.qk", "expected-error {{must be a multiple of k heads (3)}}")
    path = write(tmp_path, bad + "// -----\n" + GQA_SOFTCAP)
    out = run_opt(capsys, path, "--split-input-file", "--verify-diagnostics")
    first, second = out.split("// -----\n")
    assert first == ""
    assert second.startswith("builtin.module {")


@pytest.mark.parametrize(
    ("text", "report"),
    [
        (
            annotated(BAD_HEADS, "attn.qk", "expected-error {{head dims differ}}"),
            [
                "in.mlir:3:3: error: unexpected error: attn.qk q heads (4) must be a multiple of k heads (3)",
                'in.mlir:3:{col}: error: expected error "head dims differ" was not produced',
            ],
        ),
        (
            annotated(GQA_SOFTCAP, "attn.softcap", "expected-error {{cap must be > 0}}"),
            ['in.mlir:4:{col}: error: expected error "cap must be > 0" was not produced'],
        ),
        (
            GQA_SOFTCAP + "// -----\n" + annotated(BAD_CAP, "attn.softcap", "expected-error@-1 {{cap must be > 0}}"),
            [
                "in.mlir:12:3: error: unexpected error: attn.softcap cap must be > 0 and finite, got -1.0",
                'in.mlir:12:{col}: error: expected error "cap must be > 0" was not produced',
            ],
        ),
    ],
    ids=["wrong-message", "not-produced", "wrong-line"],
)
def test_verify_diagnostics_fails_when_an_annotation_is_not_met(capsys, tmp_path, text, report):
    """Issue 10 item 13: xDSL exited 0 whatever the annotations said."""
    path = write(tmp_path, text)
    _, err = failing_run(capsys, path, "--split-input-file", "--verify-diagnostics")
    col = next(line.index("expected-") + 1 for line in text.splitlines() if "expected-" in line)
    assert err.splitlines() == [f"{tmp_path}/{line.format(col=col)}" for line in report]


def test_help_says_what_the_diagnostic_modes_do(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args=["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for phrase in (
        "--verify-diagnostics Check the input's `// expected-error {{...}}` annotations",
        "--split-input-file Split the input at each `// -----` and process every chunk on its own",
        "--dump-stages DIR",
        "expected-error@+1",
        "ATTNFUSE_DUMP_IR=DIR",
    ):
        assert phrase in out


# --------------------------------------------------------------------------- --dump-stages


def test_dump_stages_writes_the_pipeline_stages(capsys, tmp_path):
    out = run_opt(
        capsys, write(tmp_path, GQA_SOFTCAP), "-p", "attnfuse-pipeline{sm=0}", "--dump-stages", tmp_path / "d"
    )
    names = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert names == [
        "00-input.mlir",
        "01-kernel-path.mlir",
        "02-rope-fusion.mlir",
        "03-causal-split.mlir",
        "04-tiling.mlir",
        "05-convert-attn-to-tl.mlir",
    ]
    assert (tmp_path / "d" / "05-convert-attn-to-tl.mlir").read_text() == out.rstrip("\n") + "\n"
    assert parse((tmp_path / "d" / "00-input.mlir").read_text()).is_structurally_equivalent(parse(GQA_SOFTCAP))


def test_dump_stages_with_split_input_file_writes_a_folder_per_chunk(capsys, tmp_path):
    run_opt(
        capsys,
        write(tmp_path, GQA_SOFTCAP + "// -----\n" + GQA_SOFTCAP),
        "--split-input-file",
        "-p",
        "tiling{sm=0}",
        "--dump-stages",
        tmp_path / "d",
    )
    assert sorted(str(p.relative_to(tmp_path / "d")) for p in (tmp_path / "d").rglob("*.mlir")) == [
        "0/00-input.mlir",
        "0/01-tiling.mlir",
        "1/00-input.mlir",
        "1/01-tiling.mlir",
    ]


# --------------------------------------------------------------------------- --version


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args=["--version"])
    assert exit_info.value.code == 0
    out, _ = capsys.readouterr()
    assert out.strip() == f"attnfuse-opt {version('attnfuse')} (xdsl {version('xdsl')})"


# --------------------------------------------------------------------------- issue 20: a newcomer's attnfuse-opt

EMPTY_FUNC = "func.func @f() {\n  func.return\n}\n"


def test_help_lists_attnfuse_passes_first(capsys):
    """--help lists AttnFuse's passes, one a line, before any of xDSL's (which were 150 lines
    of a comma-separated list with AttnFuse's inside)."""
    from attnfuse.passes import get_all_passes
    from attnfuse.pipeline import STAGES
    from attnfuse.tools.opt import ATTNFUSE_PASSES

    assert list(ATTNFUSE_PASSES) == list(get_all_passes())
    stages = [name for name, _ in STAGES]
    assert [n for n in ATTNFUSE_PASSES if n in stages] == stages  # listed in the pipeline's order
    with pytest.raises(SystemExit) as exit_info:
        main(args=["--help"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    ours = [next(i for i, line in enumerate(lines) if line.startswith(f"  {name}  ")) for name in ATTNFUSE_PASSES]
    assert ours == sorted(ours)
    xdsl = next(i for i, line in enumerate(lines) if "canonicalize" in line)
    assert max(ours) < xdsl
    assert max(ours) < next(i for i, line in enumerate(lines) if line.startswith("options:"))


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("rope-fuson", "; did you mean 'rope-fusion'?"),
        ("attnfuse-pipline", "; did you mean 'attnfuse-pipeline'?"),
        ("convert-attn-to-triton", "; did you mean 'convert-attn-to-tl'?"),
        ("canonicalise", "; did you mean 'canonicalize' or 'canonicalize-dmp'?"),  # xDSL's (pinned)
        ("zzz", ""),
    ],
)
def test_unknown_pass_suggests_the_closest(capsys, tmp_path, name, hint):
    _, err = failing_run(capsys, write(tmp_path, GQA_SOFTCAP), "-p", f"tiling,{name}")
    expected = f"pass pipeline 'tiling,{name}': unknown pass '{name}'{hint} (--help lists the passes)"
    assert err == f"attnfuse-opt: error: {expected}\n"


@pytest.mark.parametrize("at", ["@+1", " @+1", "  @+1"])
def test_verify_diagnostics_accepts_a_blank_before_at(capsys, tmp_path, at):
    """mlir-opt accepts `// expected-error @+1 {{...}}`; it used to be ignored, so a wrong
    message still exited 0."""
    lines = BAD_HEADS.splitlines()
    wrong = "\n".join([*lines[:2], f"  // expected-error{at} {{{{head dims differ}}}}", *lines[2:]])
    _, err = failing_run(capsys, write(tmp_path, wrong), "--verify-diagnostics")
    assert "unexpected error: attn.qk q heads (4) must be a multiple of k heads (3)" in err
    assert 'expected error "head dims differ" was not produced' in err
    right = wrong.replace("head dims differ", "must be a multiple of k heads (3)")
    assert run_opt(capsys, write(tmp_path, right), "--verify-diagnostics") == ""


def test_shipped_bad_example_verifies(capsys):
    """attnfuse/examples/bad.mlir (the README's --verify-diagnostics line): every chunk fails
    as annotated, so the exit is 0; without its annotations every chunk is an error."""
    bad = ROOT / "attnfuse" / "examples" / "bad.mlir"
    out = run_opt(capsys, bad, "--split-input-file", "--verify-diagnostics")
    assert out.count("// -----") == bad.read_text().count("// -----")


def test_shipped_bad_example_fails_without_its_annotations(capsys, tmp_path):
    bad = (ROOT / "attnfuse" / "examples" / "bad.mlir").read_text()
    chunks = bad.split("// -----")
    stripped = "// -----".join(re.sub(r"//\s*expected-error.*", "", c) for c in chunks)
    stripped = stripped.replace("{{", "").replace("}}", "")  # so the file has no annotation left
    path = write(tmp_path, stripped)
    _, err = failing_run(capsys, path, "--split-input-file")
    assert err.count("attnfuse-opt: error:") == len(chunks)


def test_dash_reads_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(EXAMPLE.read_bytes())))
    out = run_opt(capsys, "-", "-p", "kernel-path")
    assert "func.func @llama3" in out
    assert "attn.kernel_path" in out


def test_dash_names_stdin_in_diagnostics(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BAD_SYNTAX.encode())))
    _, err = failing_run(capsys, "-")
    assert err.startswith("attnfuse-opt: error: <stdin>:3:")


@pytest.mark.parametrize("passes", ["attnfuse-pipeline", "tiling", "attn-autodiff", "canonicalize,kernel-path"])
def test_a_module_without_attention_is_an_error(capsys, tmp_path, passes):
    """An AttnFuse pass on functions without an attn.qk printed them unchanged, and `-t triton`
    then said to run the pipeline that had just run."""
    _, err = failing_run(capsys, write(tmp_path, EMPTY_FUNC), "-p", passes, "-t", "triton")
    first = passes.split(",")[-1]
    assert err.startswith(f"attnfuse-opt: error: {first}: no attention to compile: no func.func in the module")
    assert "contains an attn.qk" in err


def test_a_module_without_attention_still_prints_without_attnfuse_passes(capsys, tmp_path):
    assert "func.func @f()" in run_opt(capsys, write(tmp_path, EMPTY_FUNC))
    assert "func.func @f()" in run_opt(capsys, write(tmp_path, EMPTY_FUNC), "-p", "canonicalize")
