"""A small LSP client for the tests: spawns ``python -m steerc lsp`` and speaks Content-Length framed
JSON-RPC to it over its standard input and output, as an editor does."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ServerError(Exception):
    def __init__(self, error: dict):
        super().__init__(error.get("message"))
        self.code = error.get("code")
        self.message = error.get("message")


class Client:
    def __init__(self, *args: str, cwd: str = REPO, command: list[str] | None = None):
        """Start ``python -m steerc lsp ARGS`` in ``cwd`` (or ``command``, another way to start it)."""
        self.stderr = tempfile.TemporaryFile()
        environment = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=REPO)
        command = command or [sys.executable, "-m", "steerc", "lsp", *args]
        self.proc = subprocess.Popen(command, cwd=cwd, env=environment,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.inbox: queue.Queue = queue.Queue()
        self.notifications: list[dict] = []
        self.responses: dict[int, dict] = {}
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    # ---------------------------------------------------------- the wire

    def send(self, message: dict) -> None:
        self.send_raw(json.dumps(dict(jsonrpc="2.0", **message)).encode("utf-8"))

    def send_raw(self, body: bytes) -> None:
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    self.inbox.put(None)
                    return
                if line in (b"\r\n", b"\n"):
                    break
                name, _, value = line.decode("ascii").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            self.inbox.put(json.loads(out.read(length)))

    def _pump(self, timeout: float) -> bool:
        try:
            message = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return False
        if message is None:
            raise EOFError("the server closed its output\n" + self.log())
        if "id" in message and "method" not in message:
            self.responses[message["id"]] = message
        elif "method" in message:
            self.notifications.append(message)
            if "id" in message:  # a request from the server (window/workDoneProgress/create, ...)
                self.send({"id": message["id"], "result": None})
        return True

    # ---------------------------------------------------------- messages

    def notify(self, method: str, params: dict | None = None) -> None:
        self.send({"method": method, "params": params or {}})

    def request(self, method: str, params: dict | None = None, timeout: float = 30.0):
        """The result of a request; raises ServerError for an error response."""
        self.next_id += 1
        ident = self.next_id
        self.send({"id": ident, "method": method, "params": params or {}})
        deadline = time.monotonic() + timeout
        while ident not in self.responses:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer to {method}\n" + self.log())
            self._pump(0.1)
        response = self.responses.pop(ident)
        if "error" in response:
            raise ServerError(response["error"])
        return response.get("result")

    def wait_for(self, method: str, where=lambda params: True, timeout: float = 30.0) -> dict:
        """The params of the first unseen notification ``method`` that ``where`` accepts (it is consumed)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, n in enumerate(self.notifications):
                if n["method"] == method and where(n.get("params")):
                    return self.notifications.pop(i)["params"]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} notification\n" + self.log())
            self._pump(0.05)

    def diagnostics(self, uri: str, version: int | None = None, timeout: float = 30.0) -> list[dict]:
        """The next diagnostics published for ``uri`` (for ``version``, when given)."""
        params = self.wait_for("textDocument/publishDiagnostics",
                               lambda p: p["uri"] == uri and (version is None or p.get("version") == version),
                               timeout)
        return params["diagnostics"]

    # ---------------------------------------------------------- documents

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify("textDocument/didOpen",
                    {"textDocument": {"uri": uri, "languageId": "steer", "version": version, "text": text}})

    def change(self, uri: str, version: int, text: str, rng: tuple | None = None) -> None:
        """Replace ``rng`` ((line, character), (line, character)) with ``text``; no range: the whole text."""
        change = {"text": text}
        if rng is not None:
            (l1, c1), (l2, c2) = rng
            change["range"] = {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}
        self.notify("textDocument/didChange",
                    {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]})

    def at(self, method: str, uri: str, line: int, character: int, **extra):
        params = {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}, **extra}
        return self.request(method, params)

    # ---------------------------------------------------------- life

    def initialize(self, encodings=None, options=None, root: str | None = None, watch: bool = False) -> dict:
        caps = {"textDocument": {"rename": {"prepareSupport": True},
                                 "publishDiagnostics": {"relatedInformation": True, "codeDescriptionSupport": True}}}
        if watch:  # the editor lets the server ask for file events (client/registerCapability)
            caps["workspace"] = {"didChangeWatchedFiles": {"dynamicRegistration": True}}
        if encodings is not None:
            caps["general"] = {"positionEncodings": list(encodings)}
        params = {"processId": os.getpid(), "rootUri": None, "capabilities": caps}
        if root is not None:
            params["rootUri"] = "file://" + root
        if options is not None:
            params["initializationOptions"] = options
        result = self.request("initialize", params)
        self.notify("initialized", {})
        return result

    def close(self, timeout: float = 30.0) -> int:
        """shutdown, exit, and the server's exit status."""
        self.request("shutdown")
        self.notify("exit")
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-4000:]
