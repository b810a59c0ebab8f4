"""A vLLM OpenAI-compatible server on loopback for the tests: started, waited for, always stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

BOOT_TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``steerc serve`` (or plain vLLM with ``steerc=False``) in its own process group."""

    def __init__(self, model: str, vllm_args: list[str], *, steerc: bool = True, env: dict | None = None,
                 log_path: str | None = None):
        self.model = model
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        if steerc:
            argv = [sys.executable, "-m", "steerc.cli", "serve", model, "--port", str(self.port), "--", *vllm_args]
        else:
            argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host",
                    "127.0.0.1", "--port", str(self.port), *vllm_args]
        self.log_path = log_path or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"steerc-server-{self.port}.log")
        self.log = open(self.log_path, "wb")
        full_env = dict(os.environ, **(env or {}))
        if "VLLM_ENABLE_V1_MULTIPROCESSING" not in (env or {}):
            full_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # a server as users run it (conftest.py)
        full_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=True)
        try:
            self._wait()
        except BaseException:
            self.stop()
            raise

    def _wait(self) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"the server did not come up in {BOOT_TIMEOUT} s:\n{self.tail()}")

    def tail(self, n: int = 60) -> str:
        self.log.flush()
        with open(self.log_path, "rb") as fh:
            return b"\n".join(fh.read().splitlines()[-n:]).decode("utf-8", "replace")

    def post(self, path: str, body: dict, timeout: float = 300) -> tuple[int, dict]:
        data = json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, {"raw": raw.decode("utf-8", "replace")}

    def alive(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=30)
        self.log.close()
