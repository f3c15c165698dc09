"""A fork server for lit's `attnfuse-opt` runs (lit.cfg starts it; it is not a test).

Most of an `attnfuse-opt` run is Python importing xDSL and the library (about 0.5-1.3 s a
process, ~300 processes in lit_tests). The server imports them once; each `attnfuse-opt` of a
RUN line is then a small client (`python -I -S opt_server.py client SOCKET REAL_SCRIPT ARGS...`)
that hands the server its stdin, stdout and stderr, its arguments, working folder and
environment, and exits with the status that the server's forked child reports. The child runs
`attnfuse.tools.opt.main` exactly as the `attnfuse-opt` console script does (`sys.argv[0]` the
script, `sys.exit(main())`, an uncaught exception printed with its traceback and status 1), on a
fresh copy of the server's memory, so no run sees another's state. When the server cannot be
reached, the client runs the real script instead.

    python opt_server.py serve SOCKET        # prints "ready" once listening
    python -I -S opt_server.py client SOCKET REAL_SCRIPT ARGS...
"""

import json
import os
import socket
import struct
import sys


def client(sock_path: str, real: str, args: list[str]) -> None:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
    except OSError:
        os.execv(real, [real, *args])
    request = json.dumps({"argv": [real, *args], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(s, [struct.pack("!I", len(request))], [0, 1, 2])
    s.sendall(request)
    status = b""
    while len(status) < 4:
        chunk = s.recv(4 - len(status))
        if not chunk:  # the child died without reporting (killed): a failure
            os._exit(1)
        status += chunk
    os._exit(struct.unpack("!i", status)[0])


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _child(conn: socket.socket, fds: list[int], request: dict) -> None:
    """In the forked child: run attnfuse-opt as its console script would; never returns."""
    import atexit
    import signal
    import traceback

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python's own startup sets it
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    code = 1
    try:
        from attnfuse.tools.opt import main

        try:
            code = main()
        except SystemExit as e:
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # a closed pipe, as at a real interpreter's exit
            code = code or 120
    try:
        conn.sendall(struct.pack("!i", code))
    finally:
        os._exit(0)


def _preload() -> None:
    """What attnfuse-opt imports, at start or lazily (passes, pipeline, Triton printer)."""
    import importlib
    import pkgutil

    import attnfuse.passes
    import attnfuse.tools.opt  # noqa: F401

    for info in pkgutil.walk_packages(attnfuse.passes.__path__, "attnfuse.passes."):
        importlib.import_module(info.name)
    for name in ("attnfuse.pipeline", "attnfuse.targets.triton.printer", "attnfuse.rope_freqs"):
        importlib.import_module(name)


def serve(sock_path: str) -> None:
    import signal

    _preload()
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    listener.settimeout(1.0)
    print("ready", flush=True)
    while os.getppid() == parent:  # lit gone (even killed): stop
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 4, 3)
            request = json.loads(_recv_exact(conn, struct.unpack("!I", msg)[0]))
        except (OSError, EOFError, ValueError, struct.error):
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            _child(conn, fds, request)
        for fd in fds:
            os.close(fd)
        conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        serve(sys.argv[2])
