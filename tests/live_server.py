"""An ASGI app served on 127.0.0.1 (an ephemeral port) on a thread of its own, for the tests of
``refdec serve`` and of its clients."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


@contextmanager
def serving(app):
    """Yields the base URL (``http://127.0.0.1:PORT``) while ``app`` is served."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
