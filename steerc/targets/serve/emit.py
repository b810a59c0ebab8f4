"""``steerc compile --target serve -o OUT``: ``OUT/plan.json`` and ``OUT/artifacts/<sha256>.safetensors``.

With ``--dialect vllm-hook``, IBM vLLM-Hook's intervention spec instead
(:mod:`steerc.targets.serve.vllm_hook`).
"""

from __future__ import annotations

import os

from steerc.targets.serve.format import dumps, to_serve


def _write(path: str, data: bytes) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def emit(plan, facts, out_dir: str, dialect: str = "steerc", key: bytes | None = None) -> list[str]:
    if dialect == "vllm-hook":
        from steerc.targets.serve.vllm_hook import emit_vllm_hook

        return emit_vllm_hook(plan, facts, out_dir)
    doc, artifacts = to_serve(plan, facts.to_json(), key)
    os.makedirs(os.path.join(out_dir, "artifacts"), exist_ok=True)
    _write(os.path.join(out_dir, "plan.json"), (dumps(doc) + "\n").encode("utf-8"))
    written = ["plan.json"]
    for key in sorted(artifacts):
        name = os.path.join("artifacts", f"{key}.safetensors")
        _write(os.path.join(out_dir, name), artifacts[key])
        written.append(name)
    return written
