"""`rstar2 preflight` (rstar2_cli/launch/preflight.py): each check of a node, its one line, and its
refusal. The GPUs' UUIDs are faked (this machine has none), checked against what torch declares
and what vLLM's IPC weight transfer reads; Redis and the sandbox front end are real processes on
loopback (a redis-server and `rstar2 serve-sandbox --redis`)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import closing, contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from rstar2_cli.hosts.addresses import resolved
from rstar2_cli.launch.preflight import gpu_findings, interface_findings, missing_interfaces, run_preflight

REPO = Path(__file__).resolve().parents[2]
SITE = Path(pytest.importorskip("torch").__file__).parents[1]
UUIDS = ["GPU-6b2a1f0e-0000-4000-8000-00000000000a", "GPU-6b2a1f0e-0000-4000-8000-00000000000b"]


def test_the_uuid_read_is_the_one_torch_declares_and_vllm_keys_the_ipc_buffers_by():
    stub = (SITE / "torch/_C/__init__.pyi").read_text()
    props = stub[stub.index("class _CudaDeviceProperties"):]
    assert "uuid: str" in props[:props.index("\nclass ")]
    ipc = (SITE / "vllm/distributed/weight_transfer/ipc_engine.py").read_text()
    assert "str(torch.cuda.get_device_properties(self.device_index).uuid)" in ipc


def test_distinct_uuids_pass_and_fewer_gpus_than_asked_do_not():
    assert gpu_findings(2, UUIDS) == ("2 GPU(s), UUIDs distinct", None)
    seen, problem = gpu_findings(8, UUIDS)
    assert problem == "sees 2 GPU(s), expected 8 (--gpus-per-node)"


@pytest.mark.parametrize("uuids, problem", [
    ([UUIDS[0], UUIDS[1], UUIDS[0]], f"GPUs 0 and 2 report the same UUID {UUIDS[0]}"),
    ([UUIDS[0], ""], "GPU(s) 1 report no UUID ('')"),
    (["00000000-0000-0000-0000-000000000000", UUIDS[1]], "GPU(s) 0 report no UUID"),
])
def test_duplicate_or_empty_uuids_are_refused_saying_what_the_weight_push_would_do(uuids, problem):
    seen, found = gpu_findings(len(uuids), uuids)
    assert seen.endswith("UUIDs not distinct") and found.startswith(problem), found
    assert "would load another GPU's" in found


def test_interface_variables_must_name_interfaces_of_this_node():
    present = ["lo", "eth0", "ib0"]
    assert missing_interfaces("GLOO_SOCKET_IFNAME", "ib0,eth0", present) == []
    assert missing_interfaces("GLOO_SOCKET_IFNAME", "ib1", present) == ["ib1"]
    assert missing_interfaces("NCCL_SOCKET_IFNAME", "eth", present) == []          # a prefix
    assert missing_interfaces("NCCL_SOCKET_IFNAME", "=eth", present) == ["eth"]    # exact names
    assert missing_interfaces("NCCL_SOCKET_IFNAME", "^docker,lo", present) == []   # excludes: nothing to find
    seen, problem = interface_findings({"GLOO_SOCKET_IFNAME": "ib1", "NCCL_SOCKET_IFNAME": "ib"}, 2, "head",
                                       present=lambda: present)
    assert seen == "GLOO_SOCKET_IFNAME=ib1, NCCL_SOCKET_IFNAME=ib"
    assert problem == "GLOO_SOCKET_IFNAME=ib1: no interface ib1 on this node (it has lo, eth0, ib0)"


def test_the_real_interfaces_of_this_machine_are_read():
    names = [name for _, name in socket.if_nameindex()]
    seen, problem = interface_findings({"GLOO_SOCKET_IFNAME": names[0]}, 2, "head")
    assert problem is None and seen == f"GLOO_SOCKET_IFNAME={names[0]}, NCCL_SOCKET_IFNAME unset"


def test_unset_on_several_nodes_the_hostname_must_not_resolve_to_loopback():
    table = {"node1": "127.0.1.1", "head": "10.0.0.1", "node2": "10.0.0.2"}
    resolve = table.__getitem__
    _, problem = interface_findings({}, 2, "head", present=lambda: ["lo", "eth0"], resolve=resolve, hostname="node1")
    assert problem.startswith("2 nodes, but this host's name 'node1' resolves to 127.0.1.1, so gloo would listen on "
                              "loopback") and "GLOO_SOCKET_IFNAME" in problem
    seen, problem = interface_findings({}, 2, "head", present=lambda: ["lo"], resolve=resolve, hostname="node2")
    assert problem is None and seen.endswith("gloo binds node2 = 10.0.0.2")
    # one node, or every "node" on this machine (the head on loopback): nothing to refuse
    assert interface_findings({}, 1, "head", present=lambda: ["lo"], resolve=resolve, hostname="node1")[1] is None
    assert interface_findings({}, 2, "127.0.0.1", present=lambda: ["lo"], resolve=lambda n: "127.0.0.1",
                              hostname="node1")[1] is None


def _closed_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def head_services():
    """A real redis-server and a real `rstar2 serve-sandbox --redis` front end on loopback; yields
    (redis URL, front end URL)."""
    from sandbox.redis_mode.local_server import redis_server_process

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    with redis_server_process() as redis_url:
        port = _closed_port()
        front = subprocess.Popen([sys.executable, "-m", "rstar2_cli.cli", "serve-sandbox", "--redis", redis_url,
                                  "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(url + "/ping", timeout=1)
                    break
                except OSError:
                    assert front.poll() is None and time.monotonic() < deadline, "the front end did not start"
                    time.sleep(0.2)
            yield redis_url, url
        finally:
            front.terminate()
            front.wait(30)


@pytest.fixture(scope="module")
def head():
    with head_services() as urls:
        yield urls


@pytest.mark.redis
def test_a_cpu_node_reaching_the_head_passes_in_one_line(head):
    redis_url, sandbox_url = head
    env = {k: v for k, v in os.environ.items() if not k.endswith("SOCKET_IFNAME")}
    env.update(RSTAR2_CPU_RANKS="1", SLURM_NODEID="1", SLURM_JOB_NUM_NODES="2", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "rstar2_cli.cli", "preflight", "--redis", redis_url,
                           "--sandbox-url", sandbox_url, "--gpus-per-node", "8"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # two "nodes" on this machine (the head on loopback): gloo may bind wherever the name resolves
    host = socket.gethostname()
    assert proc.stdout == (f"preflight node 1 ({host}): CPU ranks; Redis {redis_url} answers; sandbox {sandbox_url} "
                           f"answers; GLOO_SOCKET_IFNAME unset, NCCL_SOCKET_IFNAME unset, gloo binds {host} = "
                           f"{resolved(host)}\n")


@pytest.mark.redis
def test_unreachable_services_are_refused_naming_the_node_and_each_failure(head):
    redis_url, sandbox_url = head
    closed = _closed_port()
    found = run_preflight(gpus_per_node=0, redis_url=f"redis://127.0.0.1:{closed}/0", sandbox_url=sandbox_url,
                          nodes=1, timeout=2.0, env={"RSTAR2_CPU_RANKS": "1", "SLURM_NODEID": "3"})
    assert not found.ok
    assert found.line() == (f"preflight on node 3 ({socket.gethostname()}) failed: Redis redis://127.0.0.1:{closed}/0 "
                            f"unreachable (ConnectionError: Error 111 connecting to 127.0.0.1:{closed}. "
                            "Connection refused.)")
    found = run_preflight(gpus_per_node=0, redis_url=redis_url, sandbox_url=f"http://127.0.0.1:{closed}", nodes=1,
                          timeout=2.0, env={"RSTAR2_CPU_RANKS": "1"})
    assert found.problems == [f"sandbox front end http://127.0.0.1:{closed}/ping unreachable "
                              "([Errno 111] Connection refused)"]


def test_faked_gpus_through_the_cli_refuse_duplicate_uuids_with_one_line_and_exit_2(monkeypatch):
    import torch

    from rstar2_cli.cli import app

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=UUIDS[0]))
    for var in ("RSTAR2_CPU_RANKS", "SLURM_NODEID", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(var, raising=False)
    result = CliRunner().invoke(app, ["preflight", "--gpus-per-node", "2", "--nodes", "1"])
    assert result.exit_code == 2
    assert result.output == (f"error: preflight on {socket.gethostname()} failed: GPUs 0 and 1 report the same UUID "
                             f"{UUIDS[0]} (vLLM's IPC weight push finds each GPU's buffer by its UUID: a worker would "
                             "load another GPU's)\n")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=UUIDS[i]))
    result = CliRunner().invoke(app, ["preflight", "--gpus-per-node", "2", "--nodes", "1"])
    assert result.exit_code == 0 and result.output == (f"preflight {socket.gethostname()}: 2 GPU(s), UUIDs distinct; "
                                                       "GLOO_SOCKET_IFNAME unset, NCCL_SOCKET_IFNAME unset\n")
