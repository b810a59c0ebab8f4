"""vLLM-Hook's wire forms: its canonical JSON, spec hash, request salt and content-addressed artifacts.

Written as vLLM-Hook's ``core/canonical.py`` and registry compute them
(https://github.com/IBM/vLLM-Hook, read at :data:`SOURCE_COMMITS`). An
artifact is filed under its *registry id*, ``"sha256:" + hex`` (vLLM-Hook's
own name for it); steerc's serve format names an artifact by the bare hex
(:func:`steerc.targets.serve.format.artifact_id`), and so do the file names
this dialect writes.

>>> spec_salt({"ops": []}, []) == spec_salt({"ops": []}, ()) != spec_salt({"ops": []}, ["sha256:" + "0" * 64])
True
"""

from __future__ import annotations

import hashlib

import numpy as np

from steerc.core.jsonio import canonical

NAME = "vllm-hook"
SOURCE_REPOSITORY = "IBM/vLLM-Hook"
SOURCE_COMMITS = ("15a7c602b3bdf54aa5bd7cf93ac11df815591683", "e8f81462a6034a80164f87a9dc78c1ab07a491d4")

# vLLM-Hook's core/schema.py MAX_SPEC_BYTES: a larger canonical spec is E_SPEC_TOO_LARGE.
MAX_SPEC_BYTES = 64 * 1024


def canonical_bytes(obj) -> bytes:
    """vLLM-Hook's ``core.canonical.canonical_bytes``: sorted keys, compact, ASCII-escaped, UTF-8."""
    return canonical(obj).encode("utf-8")


def spec_hash(obj) -> str:
    """vLLM-Hook's ``core.canonical.spec_hash``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(obj)).hexdigest()


def spec_salt(spec, registry_ids) -> str:
    """vLLM-Hook's ``core.canonical.request_salt``: 64 lowercase hex digits, no prefix.

    sha256 over the canonical spec, then each registry id (sorted, UTF-8,
    no separator). (steerc's own request salt is
    :func:`steerc.targets.serve.request.request_salt`.)
    """
    h = hashlib.sha256(canonical_bytes(spec))
    for aid in sorted(registry_ids):
        h.update(aid.encode("utf-8"))
    return h.hexdigest()


def artifact_bytes(tensors: dict) -> bytes:
    """The canonical safetensors bytes of an artifact: float32 little-endian,
    C-contiguous, names sorted, no metadata (what aisteer360's
    ``artifact_id_for`` and vLLM-Hook's registry ``write`` produce)."""
    from safetensors.numpy import save

    return save({name: np.ascontiguousarray(np.asarray(tensors[name], dtype="<f4")) for name in sorted(tensors)})


def registry_id(data: bytes) -> str:
    """``"sha256:" + hex``, the id vLLM-Hook's registry files an artifact under."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_name(rid: str) -> str:
    """The artifact's file name: the hex of its registry id."""
    return rid.split(":", 1)[1] + ".safetensors"


def request_body(spec: dict, registry_ids) -> dict:
    """What to send: ``extra_args`` (offline ``SamplingParams``), ``vllm_xargs`` (``vllm serve``,
    the spec as its canonical JSON string) and the ``cache_salt`` both need."""
    return {
        "extra_args": {"intervention_spec": spec},
        "vllm_xargs": {"intervention_spec": canonical_bytes(spec).decode("utf-8")},
        "cache_salt": spec_salt(spec, set(registry_ids)),
    }
