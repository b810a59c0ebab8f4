"""The serve plugin's artifact store: tensors a plan names, by their sha256, in a folder on the server.

A request may name an artifact without carrying it once the server holds it
(``steerc_stage`` over RPC, or an earlier request that carried it inline):
the HTTP front end reads it from here and inlines it, so the workers read
nothing but the request. The folder is ``$STEERC_ARTIFACTS`` (else
``steerc-artifacts`` in the system's temporary folder), capped at
``$STEERC_ARTIFACTS_CAP_MB`` megabytes (1024 by default), least recently used
first out. A stored file is checked against its name the first time a store
reads it, so a file changed on disk is refused, never used.
"""

from __future__ import annotations

import os
import tempfile

from steerc.core.paths import temp_folder
from steerc.targets.serve.admission import MAX_ARTIFACT_BYTES, RequestError
from steerc.targets.serve.format import artifact_id, read_artifact


def default_store() -> str:
    return os.environ.get("STEERC_ARTIFACTS") or temp_folder("artifacts")


def default_cap() -> int:
    return int(os.environ.get("STEERC_ARTIFACTS_CAP_MB", "1024")) * 1024 * 1024


class ArtifactStore:
    """Tensors by sha256 in a folder: ``<root>/<id>.safetensors``."""

    def __init__(self, root: str | None = None, cap_bytes: int | None = None):
        self.root = root or default_store()
        self.cap_bytes = cap_bytes if cap_bytes is not None else default_cap()
        self._verified: set[str] = set()
        os.makedirs(self.root, exist_ok=True)

    def path(self, key: str) -> str:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise RequestError("artifact", f"{key!r} is not a sha256 hex digest")
        return os.path.join(self.root, f"{key}.safetensors")

    def has(self, key: str) -> bool:
        return os.path.isfile(self.path(key))

    def put(self, data: bytes, expected: str | None = None) -> str:
        """Store ``data`` under its sha256 (refused if it is not ``expected``); atomic."""
        if len(data) > MAX_ARTIFACT_BYTES:
            raise RequestError("artifact", f"{len(data)} bytes is over the {MAX_ARTIFACT_BYTES}-byte cap")
        key = artifact_id(data)
        if expected is not None and key != expected:
            raise RequestError(f"artifacts.{expected[:16]}", "content does not hash to its name (tampered?)")
        try:
            read_artifact(data, key)
        except Exception as exc:  # noqa: BLE001 - any malformed artifact is refused the same way
            raise RequestError(f"artifacts.{key[:16]}", str(exc)) from None
        path = self.path(key)
        if not os.path.exists(path):
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        self._verified.add(key)
        os.utime(path)
        self.evict(keep={key})
        return key

    def get(self, key: str) -> bytes:
        path = self.path(key)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise RequestError(f"artifacts.{key[:16]}", "not staged on this server (send it inline)") from None
        if key not in self._verified:
            if artifact_id(data) != key:
                raise RequestError(f"artifacts.{key[:16]}", "stored content does not hash to its name (tampered?)")
            self._verified.add(key)
        os.utime(path)
        return data

    def lookup(self, key: str) -> bytes | None:
        """The verified bytes of a staged artifact, or None if it is not here (tampered: refused)."""
        return self.get(key) if self.has(key) else None

    def evict(self, keep: set[str] = frozenset()) -> list[str]:
        """Remove least-recently-used artifacts until the store fits its cap."""
        entries = []
        for name in os.listdir(self.root):
            if name.endswith(".safetensors"):
                p = os.path.join(self.root, name)
                st = os.stat(p)
                entries.append((st.st_mtime, st.st_size, name[: -len(".safetensors")], p))
        total = sum(e[1] for e in entries)
        removed = []
        for _, size, key, p in sorted(entries):
            if total <= self.cap_bytes:
                break
            if key in keep:
                continue
            os.remove(p)
            self._verified.discard(key)
            total -= size
            removed.append(key)
        return removed
