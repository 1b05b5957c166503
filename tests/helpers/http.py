"""A real HTTP server on loopback for client tests, and its JSON replies."""
import contextlib
import json
import threading
from http.server import ThreadingHTTPServer


def send_json(handler, obj, status: int = 200) -> None:
    """`obj` as the body of `handler`'s reply (a BaseHTTPRequestHandler's)."""
    data = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextlib.contextmanager
def serving(handler_class):
    """A threaded server for `handler_class` on a free loopback port: yields the port,
    shuts the server down and closes its socket however the block ends."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_port
    finally:
        srv.shutdown()
        srv.server_close()
