"""``steerc compile --target vllm -o OUT``: writes ``OUT/plan.msgpack`` (see :mod:`.wire`)."""

from __future__ import annotations

import os

from steerc.targets.vllm.program import plan_document
from steerc.targets.vllm.wire import pack


def plan_bytes(plan, facts) -> bytes:
    return pack(plan_document(plan, facts))


def emit(plan, facts, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    data = plan_bytes(plan, facts)
    tmp = os.path.join(out_dir, ".plan.msgpack.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, os.path.join(out_dir, "plan.msgpack"))
    return ["plan.msgpack"]
