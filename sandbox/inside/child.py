"""What one forked child does: lock itself down, then run the snippet like a notebook cell.

Runs inside the jail, in a child freshly forked from the preloaded zygote, so sympy/numpy are
already imported and nothing from earlier calls is visible. Order matters: limits are set while
still privileged (hard limits, so the snippet cannot lift them), then the uid is dropped, and
only then does user code run. Output goes to pipes read by the zygote; the outcome class
("ok", "runtime_error", "memory") is written into the slot's byte of a shared memory map, because
exit codes alone are ambiguous (a snippet may ``sys.exit(1)`` on purpose).
"""
from __future__ import annotations

import _ast  # not `ast`: the zygote need not import that module (and tokenize, ...) to compile
import builtins
import ctypes
import io
import os
import resource
import signal
import sys

SNIPPET = "<snippet>"
OUTCOMES = ("", "ok", "runtime_error", "memory", "reroute")  # index = byte written to the status map
_REROUTE = OUTCOMES.index("reroute")
_PR_SET_NO_NEW_PRIVS = 38
_FILE_SIZE_CAP = 64 * 1024 * 1024
libc = ctypes.CDLL(None, use_errno=True)  # loaded once in the zygote, not per call (the zygote uses it too)
_ENVIRON = ctypes.c_void_p.in_dll(libc, "environ")  # what subprocesses and os.system inherit
# The same pointer as plain bytes: writing through a memoryview is one memcpy, where ctypes'
# `.value =` runs its converter and keep-alive bookkeeping (~10 pages, each a fault after a fork).
_ENVIRON_BYTES = memoryview((ctypes.c_char * ctypes.sizeof(ctypes.c_void_p)).from_address(
    ctypes.addressof(_ENVIRON))).cast("B")
_EMPTY_STDIN = io.StringIO("")  # each forked child has its own copy; execute() keeps it unless given stdin
_STREAMS: list = []  # our stdout/stderr, flushed at exit even if the snippet replaced sys.stdout


def prepare_zygote(env: dict[str, str], drop_groups: bool) -> None:
    """One-time set-up that every child inherits, so calls do not pay for it (each first touch
    in a child costs a copy-on-write page fault, ~2.5 us here): no setuid-binary escalation, no
    core dumps, the file-size cap, no supplementary groups (when calls drop to per-slot uids),
    the exact base environment, an empty stdin, and line-buffered notebook stdout/stderr on fds 1
    and 2 (which each child points at its own pipes). These limits are hard, so a call cannot
    lift them; they are the same for every call. The zygote itself never writes to sys.stdout."""
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_SIZE_CAP, _FILE_SIZE_CAP))
    if drop_groups:
        os.setgroups([])
    os.environ.clear()
    os.environ.update(env)
    os.environ["HOME"] = os.environ["TMPDIR"] = "/nonexistent"  # replaced per call
    sys.stdin = _EMPTY_STDIN
    sys.stdout = _TrackingText(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                               errors="backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    _STREAMS[:] = [sys.stdout, sys.stderr]


class SlotEnvironment:
    """The environment of every call in one slot (HOME=TMPDIR=its scratch dir), built once in
    the zygote: both os.environ's mapping and the C `environ` array that subprocesses inherit.

    The zygote activates it right before forking the slot's child, so the child inherits it and
    does no work at all. Why: setting two variables in a fresh child (glibc setenv + os.environ)
    wrote to ~35 pages shared copy-on-write with the zygote, about a tenth of a trivial call.
    Later changes by the snippet work as usual (glibc copies an `environ` array it did not
    allocate before growing it)."""

    def __init__(self, scratch: str) -> None:
        data = dict(os.environ._data)  # type: ignore[attr-defined]
        data[b"HOME"] = data[b"TMPDIR"] = os.fsencode(scratch)
        self._data = data
        self._entries = [key + b"=" + value for key, value in data.items()]
        self._array = (ctypes.c_char_p * (len(self._entries) + 1))(*self._entries, None)
        self._pointer = ctypes.addressof(self._array).to_bytes(ctypes.sizeof(ctypes.c_void_p), sys.byteorder)

    def activate(self) -> None:
        os.environ._data = self._data  # type: ignore[attr-defined]
        _ENVIRON_BYTES[:] = self._pointer


class FullTierFinder:
    """Last on a light zygote's sys.meta_path: an import that nothing else found, of a module the
    full tier can import, ends the call at once and marks it for a re-run there.

    Why here and not only in the host's static scan (sandbox.core.tiers): imports can hide from any
    scan (exec of a built string, a base64 payload, `__import__(name)`, an executor template),
    and a snippet may catch the ImportError and carry on differently. Only a miss reaches this
    finder, so it costs nothing to calls that import what the light tier has. The whole process
    group is killed (a miss in a subprocess of the call counts too); the call is isolated, so the
    re-run starts clean.
    """

    def __init__(self, paths: list[str], status_map) -> None:
        self.paths, self.status_map = paths, status_map
        self.slot = -1  # set in each forked child; -1 in the zygote itself

    def find_spec(self, name: str, path=None, target=None):
        if path is None and self.slot >= 0:  # a top-level module: submodules need their package
            from importlib.machinery import PathFinder
            if PathFinder.find_spec(name, self.paths) is not None:
                self.status_map[self.slot] = _REROUTE
                os.killpg(0, signal.SIGKILL)
        return None

    def invalidate_caches(self) -> None:
        return None


def call_rlimits(limits: dict, base_vm_bytes: int, per_call_uid: bool) -> tuple:
    """The per-call (resource, (soft, hard)) limits, computed by the zygote before the fork."""
    cpu = max(1, int(limits["cpu_time"] + 0.999))
    memory = base_vm_bytes + int(limits["memory_mb"]) * 1024 * 1024
    nproc = int(limits["max_processes"]) + (0 if per_call_uid else 8)
    return ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (memory, memory)),
            (resource.RLIMIT_NPROC, (nproc, nproc)))


def enter_call(out_w: int, err_w: int, devnull: int, scratch: str, uid: int | None, rlimits: tuple) -> None:
    """Turn the freshly forked process into a locked-down call process. Only what differs per
    call is done here; prepare_zygote() did the rest once, and the zygote computed `rlimits`."""
    os.setpgid(0, 0)  # own process group (setsid would also create a scheduler autogroup: ~3 ms)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.closerange(3, 1 << 16)
    os.chdir(scratch)
    for res, value in rlimits:  # hard limits, set while still privileged: the snippet cannot lift them
        resource.setrlimit(res, value)
    if uid is not None:
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


class _TrackingText(io.TextIOWrapper):
    """stdout that remembers whether the cell printed anything (for the notebook echo)."""

    wrote = False

    def write(self, s: str) -> int:
        if s:
            self.wrote = True
        return super().write(s)


class _TrackingProxy:
    """The same tracking for a stdout we did not create (in-process use, tests)."""

    wrote = False

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, s: str) -> int:
        if s:
            self.wrote = True
        return self._stream.write(s)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def short_error(exc: BaseException, source: str) -> str:
    """`Line 3: ZeroDivisionError: division by zero` plus the offending source line."""
    name = type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename == SNIPPET:
        text = (exc.text or "").strip()
        head = f"Line {exc.lineno}: {name}: {exc.msg}"
        return f"{head}\n    {text}" if text else head
    lineno, tb = None, exc.__traceback__
    while tb is not None:  # the deepest frame in the snippet (not `traceback`: see compile_cell)
        if tb.tb_frame.f_code.co_filename == SNIPPET:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    message = str(exc)
    head = f"{name}: {message}" if message else name
    if lineno is None:
        return head
    lines = source.splitlines()
    text = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    return f"Line {lineno}: {head}\n    {text}" if text else f"Line {lineno}: {head}"


PRECOMPILE_MAX_CHARS = 8192


def compile_cell(source: str):
    """Split a cell into (body, last expression or None), as a notebook does for its echo."""
    tree = compile(source, SNIPPET, "exec", _ast.PyCF_ONLY_AST)  # what ast.parse does
    last = None
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = compile(_ast.Expression(tree.body.pop().value), SNIPPET, "eval")
    return compile(tree, SNIPPET, "exec"), last


def _replay(history: list, namespace: dict) -> str | None:
    """Re-run earlier successful cells of a session with their output discarded."""
    real_out, real_err = sys.stdout, sys.stderr
    sink = io.StringIO()
    try:
        sys.stdout = sys.stderr = sink
        for code, stdin in history:
            sys.stdin = io.StringIO(stdin or "")
            try:
                exec(compile(code, "<session history>", "exec"), namespace)
            except SystemExit as exc:  # a cell that ended with sys.exit(0) was still "ok"
                if exc.code not in (None, 0):
                    raise
            sink.seek(0)
            sink.truncate()
    except BaseException as exc:  # noqa: BLE001 - any failure of replay is reported, not raised
        return f"Session replay failed (an earlier cell behaved differently when re-run): {type(exc).__name__}: {exc}"
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    return None


def precompile(source: str):
    """Compile a short cell in the zygote, before the fork, or None (the child then compiles it).

    Why: the first use of the parser and compiler in a fresh child copies ~140 pages of the
    zygote (copy-on-write faults), about a third of a trivial call's cost; the zygote's own pages
    are already private. Only short cells qualify, so a hostile one cannot stall the zygote (an
    8 KB cell compiles in < 10 ms on CPython 3.11, whose parser and optimiser bound nesting and
    constant folding); any compile error or warning is left for the child to report in the usual
    way (compiled here, a warning would go to the zygote's stderr, not the call's).
    The price: an interpreter crash inside compile() (none known for such input on 3.11) would
    end the zygote, failing its other calls with internal_error until the pool replaces it,
    where compiling in the child would have failed only that call.
    """
    if len(source) > PRECOMPILE_MAX_CHARS:
        return None
    try:
        return warnings_as_errors(compile_cell, source)  # a warning (`x is 1`) is the call's to print
    except BaseException:  # noqa: BLE001 - the child recompiles and reports it (warnings included)
        return None


_STRICT = ("error", None, Warning, None, 0)


def warnings_as_errors(fn, *args):
    """fn(*args) with every warning raised instead of printed, for work the zygote does on a
    call's behalf. In place on the filter list (~1 us) rather than `warnings.catch_warnings()`
    (~8 us and a list copy per call), where this interpreter has the hook for it."""
    import warnings  # loaded already in every zygote that has a preload: a lookup, not an import

    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return fn(*args)
    warnings.filters.insert(0, _STRICT)
    mutated()
    try:
        return fn(*args)
    finally:
        warnings.filters.remove(_STRICT)
        mutated()


def execute(source: str, stdin: str | None = None, history: list | None = None,
            compiled=None, namespace: dict | None = None) -> tuple[int, str]:
    """Run one cell; returns (exit code, reason). Prints the echo or the short error itself.
    `compiled` is `precompile(source)` done before the fork, when available; `namespace` the
    globals to run it in (a fresh `__main__` unless given: see sandbox.inside.template_run)."""
    if namespace is None:
        namespace = {"__name__": "__main__", "__builtins__": builtins}
    if history:
        failure = _replay(history, namespace)
        if failure:
            print(failure, file=sys.stderr)
            return 1, "runtime_error"
    if stdin is not None or sys.stdin is not _EMPTY_STDIN:
        sys.stdin = io.StringIO(stdin or "")
    if not isinstance(sys.stdout, _TrackingText):
        sys.stdout = _TrackingProxy(sys.stdout)
    try:
        body, last = compiled or compile_cell(source)
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


def finish(code: int, reason: str, status_map, slot: int) -> None:
    """Flush what we can, tell the zygote the outcome class, and leave without cleanup hooks."""
    for stream in (sys.stdout, sys.stderr, *_STREAMS):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the snippet may have closed or replaced it
            pass
    if status_map[slot] != _REROUTE:  # a subprocess of the call may have asked for the full tier
        status_map[slot] = OUTCOMES.index(reason)
    os._exit(code & 0xFF if isinstance(code, int) else 1)
