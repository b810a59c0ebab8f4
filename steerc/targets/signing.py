"""What the hashes in steerc's plans are for, and the HMAC option for authenticity.

* ``boot_sha256`` (vllm) names a plan's *structure*: what a new plan must
  share to be written into a running engine in place.
* ``content_sha256`` (vllm) and ``cache_salt`` (serve) cover everything a
  worker reads — header, structure, values — so that a truncated, partly
  edited or corrupted plan is refused. They guard against accidents: anyone
  who edits a plan can recompute them.
* ``hmac`` guards against people: HMAC-SHA256 of the same bytes under a key
  that the compiler (``--hmac-key-file``) and the engine or server
  (``STEERC_HMAC_KEY_FILE``, or ``hmac_key_file`` in the engine's steerc
  config) share. A worker or server given a key refuses every plan whose
  HMAC is missing or wrong — for example on a shared server that accepts
  plans from several teams.

>>> tag = mac(b"0123456789abcdef", b"plan")
>>> tag.startswith("hmac-sha256:") and verify(b"0123456789abcdef", b"plan", tag)
True
>>> verify(b"another key, long enough", b"plan", tag)
False
"""

from __future__ import annotations

import hashlib
import hmac
import os

PREFIX = "hmac-sha256:"
ENV = "STEERC_HMAC_KEY_FILE"
MIN_KEY_BYTES = 16


def read_key(path: str) -> bytes:
    """A key file's bytes (surrounding whitespace stripped); at least 16 bytes."""
    with open(path, "rb") as fh:
        key = fh.read(1 << 16).strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{path}: an HMAC key needs at least {MIN_KEY_BYTES} bytes")
    return key


def env_key() -> bytes | None:
    """The key named by ``$STEERC_HMAC_KEY_FILE``, if any."""
    path = os.environ.get(ENV)
    return read_key(path) if path else None


def mac(key: bytes, payload: bytes) -> str:
    return PREFIX + hmac.new(key, payload, hashlib.sha256).hexdigest()


def verify(key: bytes, payload: bytes, tag) -> bool:
    return isinstance(tag, str) and hmac.compare_digest(mac(key, payload), tag)
