"""`attnfuse-opt`: xDSL's opt driver; AttnFuse's dialects, passes and targets come
from the `xdsl.universe` entry point, so stock `xdsl-opt` sees them too.

What it changes in xDSL's `xDSLOptMain`, to behave as `mlir-opt` does:

- Bad user input (malformed IR, a malformed or unknown `-p` pipeline or pass option,
  input nested too deeply for Python's recursion limit) is one diagnostic on stderr
  and a non-zero exit, never a Python traceback.
- Verification includes SSA dominance (`attnfuse.ir.first_verifier_error`), before the
  passes and after each of them.
- `--split-input-file` processes every `// -----` chunk, reports each failing chunk's
  diagnostic, and exits non-zero if any failed (xDSL stops at the first failure).
- `--verify-diagnostics` checks `// expected-error {{...}}` annotations (see
  `ExpectedDiagnostic`): a mismatch is reported and the exit status is non-zero
  (xDSL's exits 0 whatever the annotations say). An input without any annotation keeps
  xDSL's meaning, so FileCheck can read the diagnostics.
- `--dump-stages DIR` writes the IR before and after each pass, with
  `attnfuse-pipeline` expanded into its stages (`attnfuse.compiler.IRDump`).
- `--help` lists AttnFuse's passes first, one line each, and xDSL's after them; an
  unknown pass names the closest known ones.
- The input file `-` is stdin, as when none is given.
- A module in which no function holds an attention (an `attn.qk`) is an error when an
  AttnFuse pass is asked for, instead of passing through unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import re
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import BytesIO, StringIO
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.printer import Printer
from xdsl.utils.arg_spec import parse_pipeline, parse_spec
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    ParseError,
    ShrinkException,
)
from xdsl.utils.target import Target
from xdsl.xdsl_opt_main import xDSLOptMain

from attnfuse import __version__
from attnfuse.ir import LocatingParser, SourceMap, first_verifier_error

if TYPE_CHECKING:
    from attnfuse.compiler import IRDump  # the compiler is imported only for --dump-stages

DESCRIPTION = "AttnFuse modular optimizer driver (xDSL's xdsl-opt with AttnFuse's dialects, passes and targets)"

ATTNFUSE_PASSES: dict[str, str] = {
    "attn-autodiff": "a forward function -> its backward program in attn IR (wrt=argument indices)",
    "kernel-path": "which kernel computes the forward: the sm90 Gluon kernel or the generic one",
    "rope-fusion": "where Q's and K's transforms run: Q prologue, KV loop or a pre-rotation kernel",
    "causal-split": "classify masks: skip fully masked KV blocks, mask only partial ones",
    "tiling": "tile sizes, warps and stages (passes/tiling.py's table; options override it)",
    "convert-attn-to-tl": "the kernel(s) and host launcher in the tl dialect (-t triton prints them)",
    "attnfuse-pipeline": "kernel-path, rope-fusion, causal-split, tiling, convert-attn-to-tl in order",
}
"""AttnFuse's passes (`attnfuse.passes.get_all_passes`), in the order `attnfuse/pipeline.py` runs
them, each with the line `--help` shows; the README describes their options."""

EPILOG = """\
diagnostics:
  Invalid input is reported on stderr as `attnfuse-opt: error: ...` and the exit
  status is 1. Verification includes SSA dominance (a value used before its
  definition is an error).

  --split-input-file: every `// -----` chunk is processed on its own, even after one
  fails; each failure is reported and the exit status is 1 if any chunk failed.
  Outputs of the chunks that succeed are printed, separated by `// -----`.

  --verify-diagnostics, as mlir-opt's: when the input holds `expected-error`
  annotations, the error each chunk produces must match them:
      // expected-error {{substring of the message}}       error on this line
      // expected-error@+1 {{...}}   @+N, @-N: N lines below/above this one
      // expected-error@above {{...}}, @below: the nearest line without annotation
      // expected-error@unknown {{...}}   an error that has no location
      // expected-error-re {{literal {{regex}} literal}}
  (attnfuse-opt produces errors only: an expected-warning, -note or -remark is
  never met.)
  An error no annotation expects, or an expected error that is not produced, is
  reported and makes the exit status 1. Errors whose operation has no source
  location (e.g. one raised by a pass on an op it created) match an annotation
  anywhere in their chunk. Without any annotation in the input, xdsl-opt's meaning is
  kept: each chunk's verifier or pass diagnostic is printed on stdout (for
  FileCheck) and the exit status is 0.

stage dump:
  --dump-stages DIR writes the IR as NN-<stage>.mlir into DIR: 00-input.mlir, then
  one file after each pass of -p, attnfuse-pipeline expanded into its stages
  (01-kernel-path.mlir, 02-rope-fusion.mlir, 03-causal-split.mlir, 04-tiling.mlir,
  05-convert-attn-to-tl.mlir). With --split-input-file, chunk i writes into DIR/i/.
  The compiler driver writes the same files, plus NN-triton.py (the generated
  source), for every kernel it compiles when ATTNFUSE_DUMP_IR=DIR is set: into
  DIR/<function>-<hash>/ (see attnfuse.compiler.compile_module). The runtime
  compiles only on a kernel cache miss.
"""


def _passes_help(available: Sequence[str]) -> str:
    """--help's description: AttnFuse's passes, one a line; xDSL's are listed in the epilog."""
    width = max(len(name) for name in ATTNFUSE_PASSES)
    lines = [f"  {name:<{width}}  {summary}" for name, summary in ATTNFUSE_PASSES.items() if name in available]
    return (
        DESCRIPTION
        + ".\n\nAttnFuse's passes (-p 'name{option=value ...},...'; the README lists their options):\n"
        + "\n".join(lines)
    )


def _xdsl_passes_help(available: Sequence[str]) -> str:
    """The epilog's last section: every other registered pass, wrapped."""
    others = [name for name in available if name not in ATTNFUSE_PASSES]
    text = ", ".join(others)
    wrapped = textwrap.fill(text, width=88, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
    return f"\nxDSL's passes ({len(others)}, also accepted by -p):\n{wrapped}\n"


def _unknown_pass(name: str, available: Sequence[str]) -> str:
    """The message for a pass name -p does not know, with the closest known names: AttnFuse's
    where one is close, else xDSL's."""
    ours = [p for p in available if p in ATTNFUSE_PASSES]
    close = difflib.get_close_matches(name, ours, n=2, cutoff=0.6)
    close = close or difflib.get_close_matches(name, list(available), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown pass '{name}'{hint} (--help lists the passes)"


class UsageError(Exception):
    """Bad command-line input (a malformed pass pipeline, an unknown pass or option):
    reported as one line, with the exit status 1."""


# --------------------------------------------------------------------------- --verify-diagnostics

_ANNOTATION = re.compile(
    r"expected-(?P<severity>error|warning|note|remark)(?P<regex>-re)?"
    r"(?:\s*@(?P<where>[+-]\d+|above|below|unknown))?\s*\{\{(?P<message>.*)\}\}"
)


@dataclass
class ExpectedDiagnostic:
    """One `// expected-<severity>[-re][@where] {{message}}` annotation, as mlir-opt's
    `-verify-diagnostics` reads it (blanks before `@where` allowed, as there). `line` is the
    (1-based, whole-file) line the diagnostic must be reported on, None for `@unknown`;
    `pattern` matches the message: a substring, or with `-re` the literal text with
    `{{regex}}` parts."""

    severity: str
    line: int | None
    pattern: re.Pattern[str]
    text: str
    annotation_line: int
    annotation_column: int
    seen: bool = False

    def matches(self, message: str) -> bool:
        return self.pattern.search(message) is not None


def parse_expectations(text: str, line_offset: int = 0) -> list[ExpectedDiagnostic]:
    """The annotations of one chunk; `line_offset` is the number of file lines before it."""
    found: list[ExpectedDiagnostic] = []
    below: list[ExpectedDiagnostic] = []  # `@below`s waiting for the next plain line
    last_plain: int | None = None
    for number, line in enumerate(text.splitlines(), start=1 + line_offset):
        annotations = list(_ANNOTATION.finditer(line))
        if not annotations:
            for expected in below:
                expected.line = number
            below.clear()
            last_plain = number
            continue
        for m in annotations:
            message = m["message"].strip()
            target = _target_line(m["where"], number, last_plain)
            pattern = _message_pattern(message, regex=bool(m["regex"]))
            expected = ExpectedDiagnostic(m["severity"], target, pattern, message, number, m.start() + 1)
            if m["where"] == "below":
                below.append(expected)
            found.append(expected)
    return found


def _target_line(where: str | None, number: int, last_plain: int | None) -> int | None:
    """The line an annotation on line `number` refers to (None: no location); `@below`
    is resolved later, at the next line without annotations."""
    if where is None or where == "below":
        return number
    if where == "unknown":
        return None
    if where == "above":
        return last_plain if last_plain is not None else number
    return number + int(where)


def _message_pattern(message: str, regex: bool) -> re.Pattern[str]:
    """A substring match of `message`; with `-re`, its `{{...}}` parts are regexes."""
    if not regex:
        return re.compile(re.escape(message))
    parts = re.split(r"\{\{(.*?)\}\}", message)
    return re.compile("".join(re.escape(p) if i % 2 == 0 else f"(?:{p})" for i, p in enumerate(parts)))


@dataclass
class ChunkError:
    """What went wrong with one chunk: the exception and, where known, the file line
    its operation (or its syntax error) is on."""

    error: BaseException
    line: int | None = None
    where: str | None = None
    """`file:line:column`, where known."""

    @property
    def message(self) -> str:
        """The diagnostic's message, which expected-error annotations are matched against."""
        if isinstance(self.error, ParseError):
            return self.error.msg
        if isinstance(self.error, RecursionError):
            return _too_deep()
        return str(self.error)

    def report(self) -> str:
        """The full diagnostic: for a syntax error the source line and a caret, for a
        verifier error xDSL's note (the module, with the failing op marked)."""
        text = str(self.error) if isinstance(self.error, ParseError) else self.message
        notes = "".join(f"\n{note}" for note in getattr(self.error, "__notes__", ()))
        return (text + notes).rstrip("\n")


class _ChunkFailed(Exception):
    def __init__(self, failure: ChunkError):
        super().__init__(failure.message)
        self.failure = failure


CHUNK_ERRORS = (ParseError, DiagnosticException, ValueError, OSError, RecursionError)
"""What invalid input raises while one chunk is parsed, verified, transformed and printed."""


# --------------------------------------------------------------------------- the tool


class AttnFuseOptMain(xDSLOptMain):
    version_format = "attnfuse-opt " + __version__ + " (xdsl {xdsl_version})"

    def __init__(self, args: Sequence[str] | None = None):
        self._source: SourceMap | None = None
        self._chunk_index = 0
        try:
            super().__init__(description=DESCRIPTION, args=args)
        except ArgSpecParseError as e:  # xDSL parses the -t spec after the arguments
            raise UsageError(f"target '{self.args.target}': {_arg_spec_error(e)}") from None
        self._check_target_options()

    def _check_target_options(self) -> None:
        """Build the target once, so that a bad option (`-t 'triton{x=1}'`) is a usage
        error before any input is read, not a failure of every chunk."""
        spec = parse_spec(self.args.target)
        factory = self.available_targets[spec.name]
        if inspect.signature(factory).parameters:
            return  # an old-style target: a printing function, with no options
        try:
            cast(Callable[[], type[Target]], factory)().from_spec(spec)
        except (ValueError, TypeError) as e:
            raise UsageError(f"target '{self.args.target}': {e}") from None

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser):
        super().register_all_arguments(arg_parser)
        arg_parser.description = _passes_help(list(self.available_passes))
        arg_parser.epilog = EPILOG + _xdsl_passes_help(list(self.available_passes))
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        helps = {
            "--passes": "Pass pipeline: comma-separated passes, each `name` or `name{option=value ...}` "
            "(AttnFuse's passes are listed above, xDSL's at the end)",
            "input_file": "path to the input file; `-` or none: stdin",
            "--verify-diagnostics": "Check the input's `// expected-error {{...}}` annotations against the "
            "errors produced, as mlir-opt does; exit 1 on a mismatch. Without annotations, print each "
            "chunk's verifier or pass diagnostic on stdout and exit 0, as xdsl-opt does (see below)",
            "--parsing-diagnostics": "Without expected-error annotations: print each chunk's syntax error on "
            "stdout and exit 0, as xdsl-opt does",
            "--split-input-file": "Split the input at each `// -----` and process every chunk on its own; "
            "report each failing chunk and exit 1 if any failed",
        }
        by_name = {a.dest: a for a in arg_parser._actions} | arg_parser._option_string_actions
        for option, text in helps.items():
            by_name[option].help = text
        arg_parser.add_argument(
            "--dump-stages",
            metavar="DIR",
            default=None,
            help="Write the IR before and after each pass (attnfuse-pipeline: each stage) into DIR as "
            "NN-<stage>.mlir (see below)",
        )

    # ------------------------------------------------------------------ pipeline

    def setup_pipeline(self):
        """Build the pipeline of `-p`, turning every malformed pipeline, unknown pass and
        bad option into a one-line `UsageError` that quotes the pipeline text."""
        text = self.args.passes
        try:
            specs = list(parse_pipeline(text))
        except ArgSpecParseError as e:
            raise UsageError(f"pass pipeline '{text}': {_arg_spec_error(e)}") from None
        passes: list[ModulePass] = []
        for spec in specs:
            if spec.name not in self.available_passes:
                raise UsageError(f"pass pipeline '{text}': {_unknown_pass(spec.name, list(self.available_passes))}")
            try:
                passes.append(self.available_passes[spec.name]().from_pass_spec(spec))
            except (ValueError, TypeError) as e:
                raise UsageError(f"pass pipeline '{text}': pass '{spec.name}': {e}") from None
        self.pipeline = PassPipeline(tuple(passes))

    def apply_passes(self, prog: ModuleOp):
        """Apply the passes in order; after each, verify (dominance included), and honour
        --time-passes, --print-between-passes and --dump-stages."""
        dump = self._stage_dump()
        if dump is not None:
            dump.module("input", prog)
        passes = self.pipeline.passes
        for index, module_pass in enumerate(passes):
            start = time.perf_counter()
            if dump is None:
                module_pass.apply(self.ctx, prog)
            else:
                _apply_and_dump(self.ctx, module_pass, prog, dump)
            if self.args.time_passes:
                print(f"Pass {module_pass.name} took {time.perf_counter() - start} seconds")
            if not self.args.disable_verify:
                self.verify(prog)
            if self.args.print_between_passes and index + 1 < len(passes):
                print(f"IR after {module_pass.name}:")
                Printer(stream=sys.stdout).print_op(prog)
                print("\n\n\n")

    def _stage_dump(self) -> IRDump | None:
        if self.args.dump_stages is None:
            return None
        from attnfuse.compiler import IRDump  # imports the whole compiler: only when asked

        folder = Path(self.args.dump_stages)
        if self.args.split_input_file:
            folder /= str(self._chunk_index)
        return IRDump(folder)

    # ------------------------------------------------------------------ chunks

    def get_input_stream(self) -> tuple[IO[bytes], str]:
        """The input file, or stdin when it is `-` or not given (MLIR)."""
        if self.args.input_file == "-":
            return sys.stdin.buffer, "mlir"
        return super().get_input_stream()

    def get_input_name(self) -> str:
        return "<stdin>" if self.args.input_file in (None, "-") else self.args.input_file

    def _check_has_attention(self, module: ModuleOp) -> None:
        """An AttnFuse pass on a module without any attention would print it unchanged (and
        `-t triton` then complain that it was not lowered): say what is missing instead."""
        asked = [p.name for p in self.pipeline.passes if p.name in ATTNFUSE_PASSES]
        if not asked:
            return
        from attnfuse.passes.analysis import NO_ATTENTION, variant_funcs

        if not variant_funcs(module):
            raise DiagnosticException(f"{asked[0]}: {NO_ATTENTION}")

    def parse_chunk(self, chunk: IO[bytes], file_extension: str, start_offset: int = 0) -> ModuleOp | None:
        """Parse MLIR with `LocatingParser`, so that diagnostics can name lines."""
        if file_extension != "mlir" or self.args.frontend not in (None, "mlir"):
            self._source = None
            return super().parse_chunk(chunk, file_extension, start_offset)
        parser = LocatingParser(self.ctx, chunk.read(), self.get_input_name(), line_offset=start_offset)
        self._source = parser.source
        return parser.parse_module(not self.args.no_implicit_module)

    def verify(self, module: ModuleOp) -> None:
        """Verify, dominance included; a failure names its op's line where it is known."""
        if (found := first_verifier_error(module, self._source)) is None:
            return
        if self._source is None or found.op is None:
            raise _ChunkFailed(ChunkError(found.error))
        line, where = self._source.line(found.op), self._source.locate(found.op)
        raise _ChunkFailed(ChunkError(found.error, line, where))

    def process_chunk(self, text: bytes, offset: int, file_extension: str) -> str:
        """Parse, verify, transform and print one chunk; raise `_ChunkFailed` on invalid input."""
        try:
            module = self.parse_chunk(BytesIO(text), file_extension, offset)
            if module is None:
                return ""
            if not self.args.disable_verify:
                self.verify(module)
            self._check_has_attention(module)
            self.apply_passes(module)
            return self.output_resulting_program(module)
        except UnicodeDecodeError as e:
            raise _ChunkFailed(ChunkError(ValueError(f"{self.get_input_name()} is not UTF-8 text: {e}"))) from None
        except ParseError as e:
            e.span = dataclasses.replace(e.span, line_offset=offset)
            where = e.span.get_location()
            raise _ChunkFailed(ChunkError(e, where.line, f"{where.file}:{where.line}:{where.col}")) from None
        except CHUNK_ERRORS as e:
            raise _ChunkFailed(ChunkError(e)) from None

    def run(self):
        """Process every chunk; report failures as the diagnostic modes say (see EPILOG).
        Exits with status 1 if any chunk failed unexpectedly or any annotation was not met."""
        chunks, file_extension = self.prepare_input()
        texts: list[tuple[bytes, int]] = []
        for chunk, offset in chunks:
            texts.append((chunk.read(), offset))
            chunk.close()
        expectations = [
            parse_expectations(text.decode("utf-8", "replace"), offset) if self.args.verify_diagnostics else []
            for text, offset in texts
        ]
        checking = any(expectations)
        output = self.prepare_output()
        ok = True
        try:
            for index, (text, offset) in enumerate(texts):
                self._chunk_index = index
                if index > 0:
                    output.write("// -----\n")
                failure = self._run_chunk(text, offset, file_extension, output)
                if checking:
                    ok &= self._check_expectations(failure, expectations[index])
                elif failure is not None:
                    ok &= self._report_unchecked(failure, output)
                output.flush()
        except ShrinkException:
            assert self.args.shrink
            print("Success, can shrink")
            sys.exit(0)  # shrinkray: the input can shrink
        finally:
            if output is not sys.stdout:
                output.close()
        if self.args.shrink:
            print("Failure, can't shrink")
            sys.exit(1)
        if not ok:
            sys.exit(1)

    def _run_chunk(self, text: bytes, offset: int, file_extension: str, output: IO[str]) -> ChunkError | None:
        """Process one chunk, writing its result to `output`; what failed, or None."""
        try:
            output.write(self.process_chunk(text, offset, file_extension))
        except _ChunkFailed as e:
            return e.failure
        return None

    def _report_unchecked(self, failure: ChunkError, output: IO[str]) -> bool:
        """xdsl-opt's modes: a diagnostic --verify-diagnostics (or a syntax error
        --parsing-diagnostics) asks for is printed on the output; any other failure is an
        error on stderr. Returns whether the chunk counts as a success."""
        error = failure.error
        if (isinstance(error, ParseError) and self.args.parsing_diagnostics) or (
            isinstance(error, DiagnosticException) and self.args.verify_diagnostics
        ):
            output.write(failure.report() + "\n")
            return True
        print(f"attnfuse-opt: error: {failure.report()}", file=sys.stderr)
        return False

    def _check_expectations(self, failure: ChunkError | None, expected: list[ExpectedDiagnostic]) -> bool:
        """mlir-opt's --verify-diagnostics for one chunk: the error (if any) must match an
        `expected-error` on its line, and every annotation must be met. Mismatches are
        reported on stderr; returns whether there were none."""
        name = self.get_input_name()
        ok = True
        if failure is not None:
            errors = [e for e in expected if e.severity == "error" and not e.seen]
            candidates = [e for e in errors if e.line == failure.line] if failure.line is not None else errors
            candidates += [e for e in errors if e.line is None and e not in candidates]
            match = next((e for e in candidates if e.matches(failure.message)), None)
            if match is not None:
                match.seen = True
            else:
                print(f"{failure.where or name}: error: unexpected error: {failure.message}", file=sys.stderr)
                ok = False
        for e in expected:
            if not e.seen:
                print(
                    f'{name}:{e.annotation_line}:{e.annotation_column}: error: expected {e.severity} "{e.text}" '
                    "was not produced",
                    file=sys.stderr,
                )
                ok = False
        return ok


def _apply_and_dump(ctx: Context, module_pass: ModulePass, prog: ModuleOp, dump: IRDump) -> None:
    """Apply one pass and dump the IR after it; `attnfuse-pipeline` after each stage."""
    from attnfuse.pipeline import AttnFusePipelinePass

    if isinstance(module_pass, AttnFusePipelinePass):
        module_pass.apply(ctx, prog, after=dump.module)
    else:
        module_pass.apply(ctx, prog)
        dump.module(module_pass.name, prog)


def _arg_spec_error(e: ArgSpecParseError) -> str:
    """xDSL's multi-line pipeline syntax error (location line, text, caret, message) as
    "column N: message"."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    column = lines[1].rsplit(":", 1)[-1] if len(lines) > 1 else "?"
    return f"column {column}: {lines[-1].strip()}"


def main(args: list[str] | None = None) -> None:
    warnings.filterwarnings("default", category=DeprecationWarning)
    try:
        AttnFuseOptMain(args=args).run()
    except ArgSpecParseError as e:  # a BaseException in xDSL: no traceback for a spec it could not parse
        _fail(_arg_spec_error(e))
    except RecursionError:
        _fail(_too_deep())
    except (ParseError, DiagnosticException, UsageError, ValueError, OSError) as e:
        # Malformed IR, bad pass options: a diagnostic, not a Python traceback.
        _fail(str(e), getattr(e, "__notes__", ()))


def _too_deep() -> str:
    return f"the input is nested too deeply (Python's recursion limit, {sys.getrecursionlimit()}, was reached)"


def _fail(message: str, notes: Sequence[str] = ()) -> None:
    text = StringIO()
    text.write(f"attnfuse-opt: error: {message}\n")
    for note in notes:
        text.write(f"{note}\n")
    sys.stderr.write(text.getvalue())
    sys.exit(1)


if __name__ == "__main__":
    main()
