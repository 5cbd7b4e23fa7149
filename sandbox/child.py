"""What one forked child does: lock itself down, then run the snippet like a notebook cell.

Runs inside the jail, in a child freshly forked from the preloaded zygote, so sympy/numpy are
already imported and nothing from earlier calls is visible. Order matters: limits are set while
still privileged (hard limits, so the snippet cannot lift them), then the uid is dropped, and
only then does user code run. Output goes to pipes read by the zygote; the outcome class
("ok", "runtime_error", "memory") is written to a status pipe on fd 3 because exit codes alone
are ambiguous (a snippet may ``sys.exit(1)`` on purpose).
"""
from __future__ import annotations

import ast
import builtins
import ctypes
import io
import os
import resource
import sys
import traceback

SNIPPET = "<snippet>"
STATUS_FD = 3
_PR_SET_NO_NEW_PRIVS = 38
_FILE_SIZE_CAP = 64 * 1024 * 1024


def enter_call(out_w: int, err_w: int, status_w: int, scratch: str, uid: int | None,
               limits: dict, base_vm_bytes: int) -> None:
    """Turn the freshly forked process into a locked-down call process."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(status_w, STATUS_FD)
    os.closerange(STATUS_FD + 1, 1 << 16)
    os.chdir(scratch)
    cpu = max(1, int(limits["cpu_time"] + 0.999))
    memory = base_vm_bytes + int(limits["memory_mb"]) * 1024 * 1024
    nproc = int(limits["max_processes"]) if uid is not None else int(limits["max_processes"]) + 8
    for res, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (memory, memory)),
                       (resource.RLIMIT_NPROC, (nproc, nproc)), (resource.RLIMIT_CORE, (0, 0)),
                       (resource.RLIMIT_FSIZE, (_FILE_SIZE_CAP, _FILE_SIZE_CAP))):
        resource.setrlimit(res, value)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
                       "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                       "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"})
    sys.stdout = _TrackingText(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                               errors="backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)


class _TrackingText(io.TextIOWrapper):
    """stdout that remembers whether the cell printed anything (for the notebook echo)."""

    wrote = False

    def write(self, s: str) -> int:
        if s:
            self.wrote = True
        return super().write(s)


def short_error(exc: BaseException, source: str) -> str:
    """`Line 3: ZeroDivisionError: division by zero` plus the offending source line."""
    name = type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename == SNIPPET:
        text = (exc.text or "").strip()
        head = f"Line {exc.lineno}: {name}: {exc.msg}"
        return f"{head}\n    {text}" if text else head
    lineno = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == SNIPPET:
            lineno = line
    message = str(exc)
    head = f"{name}: {message}" if message else name
    if lineno is None:
        return head
    lines = source.splitlines()
    text = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    return f"Line {lineno}: {head}\n    {text}" if text else f"Line {lineno}: {head}"


def _compile_cell(source: str):
    """Split a cell into (body, last expression or None), as a notebook does for its echo."""
    tree = ast.parse(source, SNIPPET, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), SNIPPET, "eval")
    return compile(tree, SNIPPET, "exec"), last


def _replay(history: list, namespace: dict) -> str | None:
    """Re-run earlier successful cells of a session with their output discarded."""
    real_out, real_err = sys.stdout, sys.stderr
    sink = io.StringIO()
    try:
        sys.stdout = sys.stderr = sink
        for code, stdin in history:
            sys.stdin = io.StringIO(stdin or "")
            exec(compile(code, "<session history>", "exec"), namespace)
            sink.seek(0)
            sink.truncate()
    except BaseException as exc:  # noqa: BLE001 - any failure of replay is reported, not raised
        return f"Session replay failed (an earlier cell behaved differently when re-run): {type(exc).__name__}: {exc}"
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    return None


def execute(source: str, stdin: str | None = None, history: list | None = None) -> tuple[int, str]:
    """Run one cell; returns (exit code, reason). Prints the echo or the short error itself."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if history:
        failure = _replay(history, namespace)
        if failure:
            print(failure, file=sys.stderr)
            return 1, "runtime_error"
    sys.stdin = io.StringIO(stdin or "")
    try:
        body, last = _compile_cell(source)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None and not getattr(sys.stdout, "wrote", False):
                print(repr(value))
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            code = code or 0
            return code, ("ok" if code == 0 else "runtime_error")
        print(code, file=sys.stderr)
        return 1, "runtime_error"
    except MemoryError as exc:
        print(short_error(exc, source) + "\n(memory limit exceeded)", file=sys.stderr)
        return 1, "memory"
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything
        print(short_error(exc, source), file=sys.stderr)
        return 1, "runtime_error"
    return 0, "ok"


def finish(code: int, reason: str) -> None:
    """Flush what we can, tell the zygote the outcome class, and leave without cleanup hooks."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the snippet may have closed or replaced it
            pass
    try:
        os.write(STATUS_FD, reason.encode())
    except OSError:
        pass
    os._exit(code & 0xFF if isinstance(code, int) else 1)
