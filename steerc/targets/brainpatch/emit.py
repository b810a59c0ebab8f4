"""``steerc compile --target brainpatch -o OUT``: writes ``OUT/<name>.brainpatch``."""

from __future__ import annotations

import os

from steerc.targets.brainpatch.lower import lower


def emit(plan, facts, out_dir: str, command: str = "") -> list[str]:
    """Write the archive (atomically) and return its name, relative to ``out_dir``."""
    from steerc.io.brainpatch import archive_bytes

    manifest, vectors = lower(plan, facts, command)  # the check refused what it would refuse
    data = archive_bytes(manifest, vectors)
    name = f"{manifest['name']}.brainpatch"
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".{name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, os.path.join(out_dir, name))
    return [name]
