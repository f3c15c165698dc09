"""Every code block of README.md runs as written (issue 20).

Each fenced block is one test case:

- `python`: executed in a fresh namespace (CPU-sized examples: the interpreter on tiny shapes);
- `sh`: each `attnfuse-opt ...` line is run (in-process) from the repository's root, with
  `EXAMPLE.mlir` the shipped example and `DIR` a temporary folder; `< FILE` feeds stdin; the
  exit status must be 0. A line running anything else fails the test: such a block must be marked;
- `mlir`: parsed and verified by attnfuse-opt, and found verbatim in the example file the README
  names above it;
- `text`: not code.

A block the CPU cannot run carries a marker on the line before its fence, visible in the README:
`<!-- readme-test: gpu -->` (run only where CUDA is available, as the `gpu` tests are) or
`<!-- readme-test: skip: <why> -->` (never run here; the reason is the skip message). An unmarked
block that fails fails this test.
"""

from __future__ import annotations

import io
import re
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from attnfuse.tools.opt import main as opt_main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLE = ROOT / "attnfuse" / "examples" / "llama3_rope_causal.mlir"

_FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*readme-test:\s*(?P<kind>gpu|skip)(?::\s*(?P<why>.*?))?\s*-->\s*$")
LANGUAGES = ("python", "sh", "mlir", "text")


@dataclass
class Block:
    """One fenced block: its language, its text, the README line of its opening fence, the
    marker on the line before it ("gpu", "skip" or None) and the marker's reason."""

    lang: str
    text: str
    line: int
    marker: str | None
    why: str
    before: str
    """The README's text above the block, for the mlir block's file name."""

    @property
    def id(self) -> str:
        return f"{self.lang or 'plain'}-line{self.line}"


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if i == len(lines):
            raise AssertionError(f"README.md:{start + 1}: a code block that is never closed")
        mark = _MARKER.match(lines[start - 1]) if start > 0 else None
        blocks.append(
            Block(
                lang=m["lang"],
                text="\n".join(lines[start + 1 : i]) + "\n",
                line=start + 1,
                marker=mark["kind"] if mark else None,
                why=(mark["why"] or "") if mark else "",
                before="\n".join(lines[max(0, start - 4) : start]),
            )
        )
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())


def _run_python(block: Block) -> None:
    """Run a block as the body of a module `__readme__` (registered while it runs: dynamo
    looks up the module of a function it compiles)."""
    code = compile(block.text, f"README.md:{block.line}", "exec")
    module = types.ModuleType("__readme__")
    sys.modules["__readme__"] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - the README's own example
    finally:
        del sys.modules["__readme__"]


def _opt_args(line: str, folder: Path) -> tuple[list[str], str | None]:
    """The arguments of one `attnfuse-opt` line, placeholders filled, and the file `<` feeds."""
    words = shlex.split(line, comments=True)
    assert words[0] == "attnfuse-opt", line
    stdin = None
    if "<" in words:
        at = words.index("<")
        stdin, words = words[at + 1], words[:at] + words[at + 2 :]
    fill = {"EXAMPLE.mlir": str(EXAMPLE), "DIR": str(folder / "stages")}
    args = [fill.get(w, w) for w in words[1:]]
    return args, (fill.get(stdin, stdin) if stdin is not None else None)


def run_opt_line(line: str, folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Run one README `attnfuse-opt` line in-process from the repository's root; its stdout.
    A non-zero exit fails, with the line and its stderr."""
    args, stdin = _opt_args(line, folder)
    monkeypatch.chdir(ROOT)
    if stdin is not None:
        data = (ROOT / stdin).read_bytes()
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    capsys.readouterr()
    try:
        opt_main(args=args)
    except SystemExit as e:
        out, err = capsys.readouterr()
        if e.code not in (0, None):
            pytest.fail(f"README `{line}` exited {e.code}:\n{err}")
        return out
    return capsys.readouterr()[0]


def _run_sh(block: Block, folder: Path, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch) -> None:
    commands = [ln.strip() for ln in block.text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    others = [c for c in commands if not c.startswith("attnfuse-opt ")]
    assert not others, (
        f"README.md:{block.line}: this test runs only attnfuse-opt lines; mark the block "
        f"`<!-- readme-test: skip: <why> -->` or `gpu` if it cannot run here: {others}"
    )
    assert commands, f"README.md:{block.line}: an empty sh block"
    for command in commands:
        run_opt_line(command, folder, capsys, mp)
    if any(" DIR" in c for c in commands):
        assert sorted(p.name for p in (folder / "stages").iterdir())[0] == "00-input.mlir"


def _run_mlir(block: Block, folder: Path, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch) -> None:
    path = folder / "block.mlir"
    path.write_text(block.text)
    out = run_opt_line(f"attnfuse-opt {path}", folder, capsys, mp)
    assert "func.func @" in out
    named = re.findall(r"`([\w/.-]+\.mlir)`", block.before)
    assert named, f"README.md:{block.line}: name the file an mlir block comes from on the line above it"
    assert block.text.strip() in (ROOT / named[-1]).read_text(), f"README.md:{block.line} differs from {named[-1]}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker != "gpu"], ids=lambda b: b.id)
def test_readme_block(
    block: Block, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if block.marker == "skip":
        pytest.skip(f"README.md:{block.line}: {block.why or 'marked skip'}")
    assert block.lang in LANGUAGES, (
        f"README.md:{block.line}: a block of language {block.lang!r}: write one of {LANGUAGES} after the fence"
    )
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    if block.lang == "python":
        _run_python(block)
    elif block.lang == "sh":
        _run_sh(block, tmp_path, capsys, monkeypatch)
    elif block.lang == "mlir":
        _run_mlir(block, tmp_path, capsys, monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker == "gpu"], ids=lambda b: b.id)
def test_readme_gpu_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert block.lang == "python", f"README.md:{block.line}: only python blocks can be marked gpu"
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    _run_python(block)


def test_markers_are_few_and_explained() -> None:
    """Every marker sits right above a fence and a skip says why; most blocks run."""
    text = README.read_text().splitlines()
    for number, line in enumerate(text, start=1):
        if "readme-test" in line:
            assert _MARKER.match(line), f"README.md:{number}: malformed marker {line!r}"
            assert number < len(text) and _FENCE.match(text[number]), f"README.md:{number}: no fence below it"
    skipped = [b for b in BLOCKS if b.marker == "skip"]
    assert all(b.why for b in skipped), [b.line for b in skipped if not b.why]
    run_here = [b for b in BLOCKS if b.marker is None and b.lang != "text"]
    assert {b.lang for b in run_here} == {"python", "sh", "mlir"}, [b.id for b in run_here]


def test_readme_blocks_parser() -> None:
    """The extraction itself: markers, languages and lines."""
    text = "intro\n<!-- readme-test: skip: no GPU -->\n```sh\nls\n```\n\n```python\nx = 1\n```\n"
    a, b = readme_blocks(text)
    assert (a.lang, a.marker, a.why, a.line, a.text) == ("sh", "skip", "no GPU", 3, "ls\n")
    assert (b.lang, b.marker, b.line, b.text) == ("python", None, 7, "x = 1\n")
    with pytest.raises(AssertionError, match="never closed"):
        readme_blocks("```python\nx = 1\n")


def test_opt_line_fails_on_a_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A README line attnfuse-opt rejects fails the test (the old `-p convert-attn-to-tl ...`)."""
    with pytest.raises(pytest.fail.Exception, match="exited 1"):
        run_opt_line("attnfuse-opt EXAMPLE.mlir -p convert-attn-to-tl", tmp_path, capsys, monkeypatch)


def test_project_files() -> None:
    """The files a project has (issue 20): the license the metadata names, a changelog, and the
    PEP 561 marker, shipped with the package."""
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert "license = Apache-2.0" in (ROOT / "setup.cfg").read_text()
    assert "## Unreleased" in (ROOT / "CHANGELOG.md").read_text()
    assert (ROOT / "attnfuse" / "py.typed").is_file()
    package_data = (ROOT / "setup.cfg").read_text().split("[options.package_data]")[1].split("[")[0]
    assert "py.typed" in package_data and "examples/*.mlir" in package_data
