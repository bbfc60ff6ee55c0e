"""A stand-in /metrics endpoint: a settable text (and HTTP status) served on 127.0.0.1."""

from __future__ import annotations

import http.server
import threading


class MetricsServer:
    """Serves a settable /metrics text on 127.0.0.1 (a stand-in leader pod)."""

    def __init__(self) -> None:
        self.text = ""
        self.status = 200
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = outer.text.encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        # A short poll: close() (shutdown) waits for it, 0.5 s by default, once per server.
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
