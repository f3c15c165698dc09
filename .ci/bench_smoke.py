"""Runner of .ci/bench-smoke: the benchmark scripts in two lanes at once (CI's machine has 2
cores), each lane in order and stopping at its first failure.

Each script runs in a child forked from this process after it imported torch (2-3 s a
process, paid here once): the child runs the file as `python SCRIPT ARGS...` would (its
folder first on sys.path, `__name__ == "__main__"`, sys.argv), its output into a log that is
printed whole when it ends. Nothing else is imported before the fork: a script that must set
TRITON_INTERPRET before triton is imported still does so itself. Commands that are not a
script (`-m torch.distributed.run ...`) run as a new process. The exit status is 1 if any
script failed.

Usage: python .ci/bench_smoke.py OUT_DIR
"""

from __future__ import annotations

import atexit
import os
import runpy
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch  # noqa: F401  (imported once, before the forks)


def lanes(out: Path) -> list[list[list[str]]]:
    """Two lanes of about equal length, the longest scripts first."""
    cp = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return [
        [
            ["benchmarks/bench_hf.py", "--cpu-smoke", "--out", f"{out}/hf"],
            ["benchmarks/bench_backward.py", "--cpu-smoke", "--out", f"{out}/backward"],
            ["benchmarks/ablation.py", "--cpu-smoke", "--out", f"{out}/ablation"],
            ["benchmarks/bench_fp8_accuracy.py", "--cpu-smoke", "--out", f"{out}/fp8"],
            ["benchmarks/bench_decode.py", "--cpu-smoke", "--out", f"{out}/decode"],
            ["benchmarks/overhead.py", "--calls", "200", "--repeats", "2"],
            ["benchmarks/launch_probe.py", "--cpu-smoke"],
            # its GPU half (run) has no CPU form; generate against this very commit
            ["benchmarks/gluon/commit_ab.py", "generate", "--base", "HEAD", "--dir", f"{out}/ab", "--ns", "4096"],
        ],
        [
            ["benchmarks/bench_forward.py", "--cpu-smoke", "--out", f"{out}/forward"],
            ["benchmarks/plot.py", f"{out}/forward", "--out", f"{out}/plots"],
            ["benchmarks/sweep_tiles.py", "--cpu-smoke", "--out", f"{out}/sweep"],
            ["benchmarks/bench_varlen.py", "--cpu-smoke", "--out", f"{out}/varlen"],
            ["benchmarks/bench_fp8.py", "--cpu-smoke", "--out", f"{out}/fp8_speed"],
            ["benchmarks/gluon/sm90_compile.py", "--shape", "paper", "--form", "ordered"],
            ["benchmarks/gluon/sm90_compile.py", "--direction", "fwd", "--variant", "causal"],
            # 2 processes, gloo (torchrun --standalone: a free port)
            [*cp, "benchmarks/bench_cp.py", "--smoke", "--out", f"{out}/cp"],
            [*cp, "benchmarks/train_fsdp.py", "--smoke", "--out", f"{out}/fsdp"],
        ],
    ]


def _run_script(argv: list[str]) -> int:
    """In the child: the script as `python argv...` runs it; its exit status."""
    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


def start(argv: list[str], log: Path) -> int:
    """Fork a child running `python argv...` with its output into `log`; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        if argv[0] == "-m":
            code = subprocess.call([sys.executable, *argv])
        else:
            code = _run_script(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    out = Path(sys.argv[1])
    queues = lanes(out)
    running: dict[int, tuple[int, list[str], Path, float]] = {}  # pid -> lane, argv, log, start

    def next_in(lane: int) -> None:
        if queues[lane]:
            argv = queues[lane].pop(0)
            log = out / f"lane{lane}.log"
            running[start(argv, log)] = (lane, argv, log, time.monotonic())

    for lane in range(len(queues)):
        next_in(lane)
    failed = 0
    while running:
        pid, status = os.wait()
        if pid not in running:
            continue
        lane, argv, log, t0 = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        print(f"--- [{'ab'[lane]}] python {' '.join(argv)} ({time.monotonic() - t0:.0f} s, exit {code})", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        sys.stdout.flush()
        if code == 0:
            next_in(lane)
        else:
            failed += 1
    if failed:
        print("benchmark smoke: FAILED (see the output above)")
        return 1
    print(f"benchmark smoke: {sum(map(len, lanes(Path())))} scripts passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
