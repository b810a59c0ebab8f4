"""``steerc compile --target easysteer -o OUT``: writes ``OUT/<intervention>.gguf`` for each vector, then
``OUT/spec.json``."""

from __future__ import annotations

from steerc.targets.easysteer.lower import blobs
from steerc.targets.output import write_files


def emit(plan, facts, out_dir: str, command: str = "") -> list[str]:
    """Write the vectors and the spec (each atomically, the spec last) and return their names, relative to
    ``out_dir``. The bytes depend on the plan and the model only, never on ``command`` or the folder."""
    return write_files(out_dir, blobs(plan, facts))  # the check refused what lower() would refuse
