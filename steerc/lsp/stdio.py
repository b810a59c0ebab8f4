"""``steerc lsp`` on standard input and output: the server with its features, and the frame loop.

:func:`serve` is what the command runs; :func:`run_io` reads frames with
:class:`steerc.lsp.frames.Frames` (a broken frame is skipped, not fatal).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import traceback

from pygls.io_ import StdoutWriter

from steerc.lsp import features
from steerc.lsp.frames import Frames, FrameTooLarge
from steerc.lsp.server import SteerServer, resolved_model

log = logging.getLogger("steerc.lsp")


def build() -> SteerServer:
    """A server with every request and notification steerc answers registered."""
    server = SteerServer()
    features.register(server)
    return server


def serve(model: str | None = None) -> int:
    """Serve over stdio until ``exit``; 0 when ``shutdown`` came first (LSP's rule), else 1."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="steerc lsp: %(levelname)s %(message)s")
    server = build()
    server.model = resolved_model(model, os.getcwd()) if model else None
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the JSON-RPC stream
    if not run_io(server, stdin, stdout):
        return 1
    return 0 if server.shut_down else 1


def run_io(server: SteerServer, stdin, stdout) -> bool:
    """pygls' ``start_io``, its frames read by :class:`steerc.lsp.frames.Frames` (which skips a broken frame
    instead of losing every later one); False when a frame was too long to read (said on standard error)."""
    server._stop_event = threading.Event()
    server.protocol.set_writer(StdoutWriter(stdout))
    frames = Frames(stdin)

    async def loop():
        running = asyncio.get_running_loop()
        while not server._stop_event.is_set():
            body = await running.run_in_executor(server.thread_pool, frames.next)
            if body is None:
                break
            try:
                message = json.loads(body, object_hook=server.protocol.structure_message)
            except ValueError as exc:  # not JSON (or not UTF-8): JSON-RPC's parse error, and go on
                log.warning("a frame that is not JSON (%s): %r", exc, body[:60])
                server.protocol._send_data({"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32700, "message": f"Parse error: the frame is not JSON ({exc})"[:200]}})
                continue
            except Exception:  # JSON too deep for Python, a message pygls cannot read: log it, go on
                log.error("reading a message failed:\n%s", traceback.format_exc(limit=3))
                continue
            try:
                server.protocol.handle_message(message)
            except Exception:  # a bug in a handler (they answer their own errors): log it, keep serving
                log.error("handling a message failed:\n%s", traceback.format_exc())

    try:
        asyncio.run(loop())
    except FrameTooLarge as exc:
        print(f"steerc lsp: {exc}; exiting", file=sys.stderr)
        return False
    except BrokenPipeError:
        log.error("the client closed the connection")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.shutdown()
    return True

