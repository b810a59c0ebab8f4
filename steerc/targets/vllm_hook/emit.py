"""``--target serve --dialect vllm-hook``: ``intervention_spec.json``, ``request.json`` and the artifacts."""

from __future__ import annotations

import json
import os

from steerc.ir.plan import Plan
from steerc.targets.output import write_files
from steerc.targets.vllm_hook.format import canonical_bytes, file_name, request_body
from steerc.targets.vllm_hook.lower import VllmHookError, lower_vllm_hook


def emit_vllm_hook(plan: Plan, facts, out_dir: str) -> list[str]:
    """Write ``intervention_spec.json`` (canonical bytes), ``request.json`` and
    ``artifacts/<hex>.safetensors``; returns the paths written, relative to ``out_dir``.

    Raises :class:`~steerc.targets.vllm_hook.lower.VllmHookError` (a ValueError,
    with ``.diagnostics``) if the plan has anything vLLM-Hook cannot express.
    """
    spec, artifacts, diagnostics = lower_vllm_hook(plan, facts)
    errors = [d for d in diagnostics if d.is_error]
    if errors or spec is None:
        raise VllmHookError(errors)
    request = request_body(spec, artifacts)
    blobs = {"intervention_spec.json": canonical_bytes(spec),
             "request.json": (json.dumps(request, sort_keys=True, indent=2) + "\n").encode("utf-8")}
    blobs.update((os.path.join("artifacts", file_name(rid)), artifacts[rid]) for rid in sorted(artifacts))
    return write_files(out_dir, blobs, folders=("artifacts",))
