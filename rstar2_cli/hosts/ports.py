"""TCP ports for rendezvous stores, bound without the close-then-rebind race.

Picking a port by binding port 0, reading it and closing the socket leaves a window in which any
other process (another job's store, a kernel-chosen ephemeral port of an outgoing connection) can
take it before the real store binds it; the store then fails with "address already in use" or,
worse, a peer joins the wrong store. Two race-free ways, depending on who binds:

* `master_store`: we create the store ourselves. torch's `TCPStore(host, 0, is_master=True)`
  binds port 0 itself and `store.port` reads the port back; pass the store to
  `torch.distributed.init_process_group(store=...)`.
* `reserve_port`: someone else binds (vLLM's `StatelessProcessGroup.create`, behind its NCCL
  weight-transfer rendezvous, binds `(host, port)` with SO_REUSEADDR and listens:
  vllm/distributed/utils.py). The reservation holds a socket bound with SO_REUSEADDR, not
  listening, on a kernel-chosen port until it is closed. On Linux another SO_REUSEADDR socket
  may still bind and listen on that port, so vLLM's store comes up; a bind without SO_REUSEADDR
  fails with EADDRINUSE, and the kernel hands out neither the port 0 binds of other sockets nor
  the ephemeral ports of outgoing connections on a port that has a bound socket. Keep the
  reservation open until the store is listening (vLLM's `trainer_init` returns after the
  rendezvous), then close it.
"""
from __future__ import annotations

import datetime
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

LOCALHOST = "127.0.0.1"


class PortReservation:
    """A bound, non-listening SO_REUSEADDR socket that keeps `port` out of other hands; a
    context manager (closing it releases the port)."""

    def __init__(self, host: str = LOCALHOST):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, 0))
        except OSError:
            self._sock.close()
            raise
        self.host = host
        self.port: int = self._sock.getsockname()[1]

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reserve_port(host: str = LOCALHOST) -> PortReservation:
    """A port for a store that another library binds with SO_REUSEADDR (see the module docstring)."""
    return PortReservation(host)


def master_store(host: str = LOCALHOST, world_size: int = 1,
                 timeout: datetime.timedelta = datetime.timedelta(minutes=5)) -> "dist.TCPStore":
    """The rendezvous store of a new process group, on a port the store binds itself
    (`store.port` gives it to the other ranks)."""
    import torch.distributed as dist  # lazy: torch (~1 s); weight_sync takes PortReservation without it

    return dist.TCPStore(host, 0, world_size=world_size, is_master=True, timeout=timeout)
