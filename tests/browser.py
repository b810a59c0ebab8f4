"""Headless Chromium (Debian's ``chromium`` package) driven over the DevTools protocol on a pipe.

:func:`render` opens a page file, waits for its load event, evaluates one
expression in it and takes a PNG screenshot: what a test needs to check
computed styles, boxes and the pixels actually drawn. No network, no
profile kept: a fresh ``--user-data-dir`` per call. :func:`chromium` is the
browser's path; a test skips without it, except under ``CI=true``, where it
fails (``.ci/run`` installs the package).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-pipe")


def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if path is None:
        message = "headless Chromium is not installed (apt-get install -y --no-install-recommends chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI must run the render tests (.ci/run installs it)")
        pytest.skip(message)
    return path


class _Pipe:
    """One DevTools session over the browser's fds 3 (commands in) and 4 (replies and events out)."""

    def __init__(self, browser: str, profile: str):
        cmd_read, self._cmd = os.pipe()
        self._out, out_write = os.pipe()

        def fds():  # in the child: the pipe ends become fds 3 and 4 (inheritable, as dup2 makes them)
            a, b = os.dup(cmd_read), os.dup(out_write)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([browser, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     close_fds=False, preexec_fn=fds)
        os.close(cmd_read)
        os.close(out_write)
        self._buffer = b""
        self._id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._cmd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._next(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._next(deadline))

    def _next(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._out, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd)
        os.close(self._out)


def render(page: str, expression: str, width: int = 1200, height: int = 900) -> tuple[object, bytes]:
    """(the value of ``expression`` evaluated in the loaded page, a PNG screenshot of the viewport)."""
    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="steerc-chromium-") as profile:
        pipe = _Pipe(browser, profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            pipe.send("Page.enable", session=session)
            pipe.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
            pipe.send("Page.navigate", {"url": "file://" + os.path.abspath(page)}, session=session)
            pipe.wait_event("Page.loadEventFired")
            value = pipe.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                              session=session)["result"].get("value")
            shot = pipe.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        finally:
            pipe.close()
    return value, base64.b64decode(shot)
