"""Serve the trajectory page and its folder read-only on 127.0.0.1 until Ctrl-C.

`http.server.SimpleHTTPRequestHandler` answers GET and HEAD only (any other method is 501), so
nothing can be written through it. `/` is the page (`InspectServer.page`, held in memory);
`/step/NNNNNN.json` is one RL step's trajectories, read from its rollout files at each request
(reader.py `read_step`), as {"step", "total", "trajectories"}; an unknown step is 404 and an
unreadable file 500, each with {"error": one line}; every other path is a file under the folder.
"""
from __future__ import annotations

import functools
import io
import json
import re
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rstar2_cli.inspector.page import clean
from rstar2_cli.inspector.reader import InspectError, read_step

STEP_PATH = re.compile(r"^/step/(\d{1,9})\.json$")


class InspectServer(ThreadingHTTPServer):
    """A server on 127.0.0.1:`port` (0: any free port) for `folder`; `page`: the HTML `/` answers."""

    daemon_threads = True

    def __init__(self, folder: str | Path, port: int, page: bytes = b""):
        self.folder, self.page = Path(folder), page
        super().__init__(("127.0.0.1", port), functools.partial(PageHandler, directory=str(folder)))


class PageHandler(SimpleHTTPRequestHandler):
    """Files under `directory`; `/` and `/index.html` answer the page, `/step/N.json` a step."""

    server: InspectServer

    def send_head(self):  # SimpleHTTPRequestHandler's one place that opens what a GET/HEAD returns
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if path in ("/", "/index.html"):
            return self.answer(200, "text/html; charset=utf-8", self.server.page)
        step = STEP_PATH.match(path)
        if step:
            return self.step(int(step.group(1)))
        return super().send_head()

    def step(self, step: int):
        try:
            rows = read_step(self.server.folder, step)
        except InspectError as e:
            return self.json(500, {"error": str(e)})
        if rows is None:
            return self.json(404, {"error": f"step {step}: no rollouts file in {self.server.folder / 'rollouts'}"})
        return self.json(200, {"step": step, "total": len(rows), "trajectories": rows})

    def json(self, code: int, payload: Any):
        body = json.dumps(clean(payload), separators=(",", ":"), allow_nan=False).encode()
        return self.answer(code, "application/json", body)

    def answer(self, code: int, content_type: str, body: bytes):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, format: str, *args: Any) -> None:   # quiet: the command prints the address
        pass


def make_server(folder: str | Path, port: int, page: bytes = b"") -> InspectServer:
    """A server on 127.0.0.1:`port` (0: any free port) for `folder`, answering `page` at `/`."""
    return InspectServer(folder, port, page)


def serve_until_interrupted(server: ThreadingHTTPServer, announce=print) -> None:
    """Answer requests until Ctrl-C, then close the socket."""
    announce(f"serving http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
