"""Serve the trajectory page and its folder read-only on 127.0.0.1 until Ctrl-C.

`http.server.SimpleHTTPRequestHandler` answers GET and HEAD only (any other method is 501), so
nothing can be written through it; `/` is the page, every other path a file under the folder.
"""
from __future__ import annotations

import functools
import io
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class PageHandler(SimpleHTTPRequestHandler):
    """Files under `directory`; `/` and `/index.html` answer the page."""

    def __init__(self, *args: Any, page: Path, **kwargs: Any) -> None:
        self.page = page
        super().__init__(*args, **kwargs)

    def send_head(self):  # SimpleHTTPRequestHandler's one place that opens what a GET/HEAD returns
        if self.path.split("?", 1)[0] in ("/", "/index.html"):
            body = self.page.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return io.BytesIO(body)
        return super().send_head()

    def log_message(self, format: str, *args: Any) -> None:   # quiet: the command prints the address
        pass


def make_server(page: Path, folder: Path, port: int) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:`port` (0: any free port) for `page` and `folder`."""
    handler = functools.partial(PageHandler, page=Path(page), directory=str(folder))
    return ThreadingHTTPServer(("127.0.0.1", port), handler)


def serve_until_interrupted(server: ThreadingHTTPServer, announce=print) -> None:
    """Answer requests until Ctrl-C, then close the socket."""
    announce(f"serving http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
