"""``steerc compile --target vllm -o OUT``: writes ``OUT/plan.msgpack`` (see :mod:`.wire`)."""

from __future__ import annotations

import os

from steerc.targets.vllm.program import plan_document
from steerc.targets.vllm.wire import pack, seal


def plan_bytes(plan, facts, key: bytes | None = None) -> bytes:
    """The plan's msgpack bytes, sealed (``content_sha256``; with ``key``, an HMAC too)."""
    return pack(seal(plan_document(plan, facts), key))


def emit(plan, facts, out_dir: str, key: bytes | None = None) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    data = plan_bytes(plan, facts, key)
    tmp = os.path.join(out_dir, ".plan.msgpack.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, os.path.join(out_dir, "plan.msgpack"))
    return ["plan.msgpack"]
