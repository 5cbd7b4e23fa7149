"""Where torch.distributed's gloo groups listen on a node, and whether the other nodes can reach it.

Without GLOO_SOCKET_IFNAME, gloo listens on the address this host's name resolves to, and on
loopback when it resolves to nothing (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, whose
warning in the installed libtorch_cpu.so reads "Unable to resolve hostname to a (local) address.
Using the loopback address as fallback. Manually set the network interface to bind to with
GLOO_SOCKET_IFNAME."). A name on loopback (a Debian-style `127.0.1.1 hostname` line in /etc/hosts)
leaves the other nodes nothing to connect to, and the run hangs at its first object collective.
`loopback_refusal` says so in one line; the trainers (`rl/ranks/dist.py` `check_node_address`) and the
allocation's preflight (`launch/preflight.py`) both ask it.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping

INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def host_address(name: str) -> str:
    """The first address `name` resolves to, as gloo's TCP transport takes it (getaddrinfo, the
    first address it can bind)."""
    return socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0]


def is_loopback(address: str | None) -> bool:
    """A loopback address; None (a name that resolved to nothing) counts as one: gloo falls back to it."""
    if address is None:
        return True
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def resolved(name: str, resolve: Callable[[str], str] = host_address) -> str | None:
    """`resolve(name)`, or None when the name resolves to nothing."""
    try:
        return resolve(name)
    except OSError:
        return None


def loopback_refusal(nodes: int, env: Mapping[str, str], master: str | None, *,
                     resolve: Callable[[str], str] = host_address, hostname: str | None = None) -> str | None:
    """Why a job on `nodes` nodes cannot connect its gloo groups from this host, in one line, or
    None: this host's name resolves to loopback (or to nothing) and GLOO_SOCKET_IFNAME is unset.
    All "nodes" on one machine (`master`, the head node's name or address, itself loopback, as in
    a simulated multi-node test) connect fine and pass."""
    if nodes < 2 or env.get("GLOO_SOCKET_IFNAME"):
        return None
    if master and is_loopback(resolved(master, resolve)):
        return None
    name = hostname or socket.gethostname()
    address = resolved(name, resolve)
    if not is_loopback(address):
        return None
    return (f"{nodes} nodes, but this host's name {name!r} resolves to {address or 'no address'}, so gloo would "
            f"listen on loopback, where the other nodes cannot connect: set GLOO_SOCKET_IFNAME (and "
            f"NCCL_SOCKET_IFNAME) to the network interface the nodes share, e.g. GLOO_SOCKET_IFNAME=eth0 "
            f"NCCL_SOCKET_IFNAME=eth0 (`ip -br addr` lists them)")
