"""``steerc compile --target serve -o OUT``: ``OUT/plan.json`` and ``OUT/artifacts/<sha256>.safetensors``.

(``--dialect vllm-hook`` is its own target: :mod:`steerc.targets.vllm_hook`.)
"""

from __future__ import annotations

import os

from steerc.targets.output import write_files
from steerc.targets.serve.format import dumps, to_serve


def emit(plan, facts, out_dir: str, key: bytes | None = None) -> list[str]:
    """Write the plan and its artifacts; returns the names written, relative to ``out_dir``."""
    doc, artifacts = to_serve(plan, facts.to_json(), key)
    blobs = {"plan.json": (dumps(doc) + "\n").encode("utf-8")}
    blobs.update((os.path.join("artifacts", f"{aid}.safetensors"), artifacts[aid]) for aid in sorted(artifacts))
    return write_files(out_dir, blobs, folders=("artifacts",))
