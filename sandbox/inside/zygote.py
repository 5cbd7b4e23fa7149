"""The pre-forked worker: a preloaded Python that forks one fresh child per call.

Started once per worker inside the jail (so namespaces are set up once, not per call), it imports
sympy/numpy/... and then serves request frames (sandbox.inside.frames) on fd 0, answering on fd 1.
Each request runs in a child forked from this preloaded state, so no state leaks between calls.
Up to `slots` children run at once; each slot owns a scratch dir, a stdout/stderr pipe pair and,
when the zygote may change uids, its own uid, which makes RLIMIT_NPROC per call, stops calls
signalling each other or the zygote, and lets us find every process a call left behind (even
double-forked daemons) by uid. Without uid changes the zygote runs one call at a time as a child
subreaper and kills all its descendants after each call.

What a call costs is mostly the kernel's: the fork copies the zygote's page tables, the exit
tears them down, and every page either side writes afterwards is a copy-on-write fault (~2.5 us
here). Hence the shape of this module: per-call work is done before a burst of forks or after
it, never between two; what is the same for every call is done once at start-up.
"""
from __future__ import annotations

import errno
import gc
import marshal
import mmap
import os
import select
import signal
import sys
import time

from sandbox.inside import child, template_run
from sandbox.inside.frames import FrameBuffer, encode_answer, encode_ready
from sandbox.inside.proctable import descends, processes, reap
from sandbox.inside.scratch import remove_tree

_READ = 65536
CALL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
_PR_SET_CHILD_SUBREAPER = 36


class Call:
    __slots__ = ("req", "slot", "pid", "pidfd", "start", "deadline", "cap", "out", "err",
                 "reason", "dirty")  # one small object per call: fewer pages for the zygote to touch

    def __init__(self, req: dict, slot: int, pid: int, pidfd: int):
        self.req, self.slot, self.pid, self.pidfd = req, slot, pid, pidfd
        self.start = time.monotonic()
        self.deadline = self.start + float(req["limits"]["timeout"])
        self.cap = int(req["limits"]["max_output_bytes"])
        self.out, self.err = bytearray(), bytearray()
        self.reason: str | None = None  # set when we end the call ourselves
        self.dirty = False  # something other than the zygote forked while this call ran


class Zygote:
    def __init__(self, config: dict) -> None:
        self.slots = int(config["slots"])
        self.uid_base = config.get("uid_base")
        self.scratch_root = config["scratch_root"]
        # built once: os.path.join in a child costs ~30 page faults
        self.scratch = [os.path.join(self.scratch_root, f"slot{slot}") for slot in range(self.slots)]
        self.poll = select.epoll()  # plain epoll: the selectors module costs ~40 page faults a call
        self.watched: dict[int, tuple[int, str]] = {}  # fd -> (slot, "out" | "err" | "exit")
        self.pipes: list[tuple[int, int, int, int]] = []  # per slot: stdout r/w, stderr r/w
        self.frames = FrameBuffer()
        self.free = list(range(self.slots))
        self.waiting: list[dict] = []
        self.outbox: list[bytes] = []  # answer frames of this loop round, sent together
        self.calls: dict[int, Call] = {}  # by slot
        self.base_vm = 0
        self.status_map = mmap.mmap(-1, max(1, self.slots))  # shared with children: outcome bytes
        self.pid = os.getpid()
        self.own_pid_ns = bool(config.get("own_pid_ns"))
        # light tier: imports of modules only the full tier has send the call there
        self.finder = child.FullTierFinder(config["reroute_paths"], self.status_map) \
            if config.get("reroute_paths") else None
        self.preludes = template_run.Preludes()  # executor templates' preludes, run here once each
        self.last_forked = 0
        self._trashed = 0
        self._skip_pids = frozenset({"1", str(self.pid)})
        self._ns_last_pid = os.open("/proc/sys/kernel/ns_last_pid", os.O_RDONLY | os.O_CLOEXEC) \
            if self.own_pid_ns else -1

    # ---- set-up -------------------------------------------------------------------------
    def preload(self, modules: list[str]) -> None:
        child.prepare_zygote(CALL_ENV, drop_groups=self.uid_base is not None)
        for name in modules:
            __import__(name)
        if "sympy" in modules:  # warm lazy caches so every child starts hot
            import sympy
            sympy.factorint(2**61 - 1)
            sympy.simplify(sympy.Symbol("x") ** 2 - 1)
        if self.finder is not None:
            sys.meta_path.append(self.finder)
        child.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans come back to us
        os.makedirs(self.scratch_root, exist_ok=True)
        self.environments = []
        for slot in range(self.slots):  # per slot, reused by its calls: scratch dir, environment, pipes
            self._fresh_scratch(slot)
            self.environments.append(child.SlotEnvironment(self.scratch[slot]))
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            for fd, kind in ((out_r, "out"), (err_r, "err")):
                os.set_blocking(fd, False)
                self.poll.register(fd, select.EPOLLIN)
                self.watched[fd] = (slot, kind)
            self.pipes.append((out_r, out_w, err_r, err_w))
        self.devnull = os.open(os.devnull, os.O_RDONLY)
        gc.collect()
        gc.freeze()
        with open("/proc/self/status") as f:
            vm = next(line for line in f if line.startswith("VmSize:"))
        self.base_vm = int(vm.split()[1]) * 1024

    def _fresh_scratch(self, slot: int) -> None:
        """Wipe the slot's scratch dir (cheaply, when the call left it empty)."""
        path = self.scratch[slot]
        try:
            if not os.listdir(path):
                os.chmod(path, 0o700)
                return
        except OSError:
            pass
        remove_tree(path)
        if os.path.lexists(path):  # something we could not delete: move it out of the way
            self._trashed += 1
            os.rename(path, os.path.join(self.scratch_root, f".trash-{slot}-{self._trashed}"))
        os.mkdir(path, 0o700)
        if self.uid_base is not None:
            os.chown(path, self.uid_base + slot, self.uid_base + slot)

    # ---- serving ------------------------------------------------------------------------
    def serve(self) -> None:
        os.set_blocking(0, False)
        self.poll.register(0, select.EPOLLIN)
        self._send(encode_ready(self.base_vm, self.slots))
        while True:
            now = time.monotonic()
            timeout = min((c.deadline for c in self.calls.values()), default=now + 3600) - now
            for fd, _ in self.poll.poll(max(0.0, timeout)):
                if fd == 0:
                    if not self._read_requests():
                        return
                elif fd in self.watched:  # (an earlier event of this round may have closed it)
                    self._on_event(fd, *self.watched[fd])
            now = time.monotonic()
            expired = [c for c in self.calls.values() if c.deadline <= now]
            for call in expired:  # stop them all before finishing any: they exit in parallel
                self._stop(call, "timeout")
            for call in expired:
                self._finish(call)
            if self.outbox:  # this round's answers in one write, before the next burst of forks
                self._send(b"".join(self.outbox))
                self.outbox.clear()
            if self.waiting and self.free:
                self._start_waiting()

    def _start_waiting(self) -> None:
        """Start queued calls in one burst of forks: everything a call needs (its compiled cell,
        limits) is made before the first fork, and its bookkeeping done after the last.

        Why: after a fork every page the zygote writes is a copy-on-write fault (~2.5 us here), so
        work done between two forks is paid again in faults for every fork of the burst; done
        before or after the burst, it is paid once.
        """
        n = min(len(self.waiting), len(self.free))
        batch, self.waiting = self.waiting[:n], self.waiting[n:]
        starts = []
        for req in batch:
            slot = self.free.pop(0)
            self.status_map[slot] = 0
            cell = self.preludes.prepare(req) if req.get("template") else None
            if cell is None and not req.get("history"):
                cell = child.precompile(req["code"])
            rlimits = child.call_rlimits(req["limits"], self.base_vm, self.uid_base is not None)
            starts.append((req, slot, cell, rlimits))
        if self.own_pid_ns and self._last_pid() != self.last_forked:
            self._mark_dirty()  # a running call forked since our last fork: scan for it at its end
        pids = []
        for req, slot, cell, rlimits in starts:
            self.environments[slot].activate()  # inherited by the child: it does no work for it
            pid = os.fork()
            if pid == 0:
                self._run_child(req, slot, cell, rlimits)
            pids.append(pid)
        self.last_forked = pids[-1]
        # Only we fork in our pid namespace unless a call does: then our pids are not consecutive.
        others_forked = self.own_pid_ns and (self._last_pid() != pids[-1] or
                                             any(b != a + 1 for a, b in zip(pids, pids[1:])))
        for (req, slot, _, _), pid in zip(starts, pids):
            call = self.calls[slot] = Call(req, slot, pid, os.pidfd_open(pid))
            self.poll.register(call.pidfd, select.EPOLLIN)
            self.watched[call.pidfd] = (slot, "exit")
        if others_forked:
            self._mark_dirty()

    def _mark_dirty(self) -> None:
        for running in self.calls.values():
            running.dirty = True

    def _run_child(self, req: dict, slot: int, cell, rlimits: tuple) -> None:
        """In the forked child: lock down, run the cell, and leave; never returns."""
        code, reason = 1, "runtime_error"
        try:
            uid = None if self.uid_base is None else self.uid_base + slot
            if self.finder is not None:
                self.finder.slot = slot
            _, out_w, _, err_w = self.pipes[slot]
            child.enter_call(out_w, err_w, self.devnull, self.scratch[slot], uid, rlimits)
            history, namespace = req.get("history"), None
            if isinstance(cell, tuple) and len(cell) == 3:  # a recognised template (Preludes.prepare)
                prelude, cell, prelude.memo.table = cell
                history, namespace = None, prelude.namespace
            # one call site for both: a stack the snippet prints is the same either way
            code, reason = child.execute(req["code"], req.get("stdin"), history, cell, namespace)
        except BaseException as exc:  # noqa: BLE001 - never let a child return into the zygote
            try:
                os.write(2, f"Sandbox internal error: {type(exc).__name__}: {exc}".encode())
            except OSError:
                pass
        finally:
            child.finish(code, reason, self.status_map, slot)

    def _read_requests(self) -> bool:
        try:
            data = os.read(0, _READ)
        except BlockingIOError:
            return True
        if not data:  # host went away: end everything
            for call in list(self.calls.values()):
                self._kill_leftovers(call)
            return False
        self.waiting.extend(self.frames.feed(data))
        return True

    def _on_event(self, fd: int, slot: int, kind: str) -> None:
        call = self.calls.get(slot)
        if kind == "exit":
            if call is not None and call.pidfd == fd:
                self._finish(call)
            return
        self._drain(fd, call, kind, once=True)  # no call: bytes from an ended call's last moments, dropped
        if call is not None and len(call.out) + len(call.err) > call.cap:
            self._stop(call, "output_limit")
            self._finish(call)

    @staticmethod
    def _drain(fd: int, call: Call | None, kind: str, once: bool = False) -> None:
        """Read the pipe (non-blocking) into the call's `kind` buffer while its output is within its cap."""
        while True:
            try:
                data = os.read(fd, _READ)
            except (BlockingIOError, InterruptedError):
                return
            if call is not None and len(call.out) + len(call.err) <= call.cap:
                (call.out if kind == "out" else call.err).extend(data)
            if once or not data:
                return

    def _kill_leftovers(self, call: Call) -> None:
        """SIGKILL every process of this call, including ones that double-forked away."""
        if self.own_pid_ns and not (call.dirty or call.reason) and self._last_pid() == self.last_forked:
            return  # only the zygote forked in our pid namespace since this call began: no leftovers
        uid = None if self.uid_base is None else self.uid_base + call.slot
        tracked = {c.pid for c in self.calls.values()}
        for _ in range(1000):
            victims = []
            for pid, puid, ppid, state in processes(self._other_uids(call.slot), self._skip_pids):
                if state == "Z":
                    if ppid == self.pid and pid not in tracked:  # an orphan reparented to us
                        reap(pid)
                elif (puid == uid if uid is not None else descends(pid, self.pid)):
                    victims.append(pid)
            if not victims:
                return
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.sched_yield()  # let the victims run their exit before we look again

    @staticmethod
    def _stop(call: Call, reason: str) -> None:
        """End a live call now (by pid: it may not have dropped to its slot's uid yet)."""
        call.reason = reason
        os.kill(call.pid, signal.SIGKILL)

    def _other_uids(self, slot: int) -> frozenset:
        if self.uid_base is None:
            return frozenset()
        return frozenset(self.uid_base + s for s in range(self.slots) if s != slot)

    def _finish(self, call: Call) -> None:
        self._kill_leftovers(call)
        _, status = os.waitpid(call.pid, 0)
        wall = time.monotonic() - call.start
        out_r, _, err_r, _ = self.pipes[call.slot]
        self._drain(out_r, call, "out")  # every writer is dead: all it wrote is there
        self._drain(err_r, call, "err")
        self._unwatch(call.pidfd)
        outcome = child.OUTCOMES[self.status_map[call.slot] % len(child.OUTCOMES)]
        if outcome == "reroute" and self.finder is None:  # only a light zygote's finder writes it
            outcome = ""
        exit_code, reason, note = _outcome(status, outcome, call)
        cap = call.cap
        out = bytes(call.out[:cap])
        err = bytes(call.err[:max(0, cap - len(out))])
        if note:
            err += (b"\n" if err and not err.endswith(b"\n") else b"") + note.encode()
        self.outbox.append(encode_answer(call.req["id"], exit_code, wall, reason, out, err))
        del self.calls[call.slot]
        self._fresh_scratch(call.slot)
        self.free.append(call.slot)

    def _unwatch(self, fd: int) -> None:
        self.poll.unregister(fd)
        del self.watched[fd]
        os.close(fd)

    def _last_pid(self) -> int:
        return int(os.pread(self._ns_last_pid, 32, 0))

    def _send(self, frame: bytes) -> None:
        data = memoryview(frame)
        os.set_blocking(1, True)
        while data:
            data = data[os.write(1, data):]


def _outcome(status: int, child_reason: str, call: Call) -> tuple[int | None, str, str]:
    """(exit_code, reason, note for stderr) from how the child ended."""
    limits = call.req["limits"]
    if child_reason == "reroute" and call.reason is None:
        return None, "reroute", ""
    if call.reason == "timeout":
        return None, "timeout", f"Timeout: the code ran longer than {limits['timeout']:g} s and was stopped."
    if call.reason == "output_limit":
        return None, "output_limit", f"Output limit: more than {call.cap} bytes of output; the run was stopped."
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return None, "timeout", f"Timeout: CPU time limit of {limits['cpu_time']:g} s exceeded."
        return None, "runtime_error", f"Killed by signal {signal.Signals(sig).name}."
    code = os.WEXITSTATUS(status)
    if child_reason in ("ok", "runtime_error", "memory"):
        if child_reason == "ok" and code != 0:
            return code, "runtime_error", ""
        return code, child_reason, ""
    return code, ("ok" if code == 0 else "runtime_error"), ""


def _unshare_network() -> None:
    """The "namespaces" backend: leave the host network (and IPC/UTS) without bubblewrap."""
    import ctypes
    clone_newnet, clone_newipc, clone_newuts = 0x40000000, 0x08000000, 0x04000000
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(clone_newnet | clone_newipc | clone_newuts) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")


def main() -> None:
    config = marshal.loads(bytes.fromhex(sys.argv[1]))  # written by JailPlan.command (trusted)
    if sys.flags.no_site:  # started with -S (see JailPlan.command): keep the builtins calls expect
        import site
        site.setquit()
        site.setcopyright()
        site.sethelper()
    paths = config.get("sys_path")
    if paths:  # the host's import path (sandbox.jail.paths.jail_paths): `-I` ignored PYTHONPATH and the user site
        sys.path[1:] = [*paths, *(p for p in sys.path[1:] if p not in paths)]
    if config.get("unshare_net"):
        _unshare_network()
    zygote = Zygote(config)
    zygote.preload(config.get("preload", []))
    try:
        zygote.serve()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise


if __name__ == "__main__":
    main()
