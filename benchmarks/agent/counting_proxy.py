"""A reverse proxy in front of the api-server that counts the requests a worker makes.

The benchmark points a worker's Edge API URL at it to count what an idle worker asks of the
api-server, the same way for both workers (the api-server's own access log is off by default).
Requests are forwarded one by one, bodies and headers as they came; responses go back
unchanged (no decompression). Counts are by method and path, the query string left out.
"""

from __future__ import annotations

import collections
import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Hop-by-hop headers (RFC 9110 section 7.6.1): for one connection, never forwarded.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}


class CountingProxy:
    def __init__(self, upstream: str):
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise ValueError(f"upstream must be http://HOST:PORT, got {upstream!r}")
        self._upstream = (parsed.hostname, parsed.port)
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="counting-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "CountingProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def counts(self) -> collections.Counter[str]:
        """Requests so far, by ``METHOD /path``."""
        with self._lock:
            return collections.Counter(self._counts)

    def _count(self, method: str, path: str) -> None:
        with self._lock:
            self._counts[f"{method} {urllib.parse.urlsplit(path).path}"] += 1

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                proxy._count(self.command, self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    payload = answer.read()
                finally:
                    upstream.close()
                self.send_response_only(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                pass  # one line per request would drown the benchmark's own output

        return Forward
