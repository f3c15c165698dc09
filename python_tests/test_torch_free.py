"""The compiler path (parse, passes, lowering to tl, the Triton printer) never imports
torch: `attnfuse-opt` stays fast, as attnfuse/__init__.py promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "attnfuse" / "examples" / "llama3_rope_causal.mlir"

# Runs attnfuse-opt's main in this interpreter, then writes the torch modules it loaded to
# the file named by its first argument.
PROBE = """
import sys
from attnfuse.tools.opt import main

report, args = sys.argv[1], sys.argv[2:]
try:
    main(args)
except SystemExit as e:
    if e.code:
        raise
with open(report, "w") as f:
    f.write(" ".join(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
"""


def test_attnfuse_opt_to_triton_does_not_import_torch(tmp_path: Path) -> None:
    """`attnfuse-opt <example> -p 'attnfuse-pipeline{sm=90 seq-len=8192}' -t triton`, in a
    fresh interpreter, prints the kernels and leaves no torch module loaded."""
    report = tmp_path / "torch_modules.txt"
    args = [str(EXAMPLE), "-p", "attnfuse-pipeline{sm=90 seq-len=8192}", "-t", "triton"]
    proc = subprocess.run([sys.executable, "-c", PROBE, str(report), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "@triton.jit" in proc.stdout
    assert report.read_text() == "", f"the compiler imported {report.read_text()}"
