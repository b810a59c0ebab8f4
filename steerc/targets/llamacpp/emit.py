"""``steerc compile --target llamacpp -o OUT``: writes ``OUT/control_vector.gguf``."""

from __future__ import annotations

import os

from steerc.targets.llamacpp.lower import FILE_NAME, control_vector


def emit(plan, facts, out_dir: str, command: str = "") -> list[str]:
    """Write the control vector (atomically) and return the names written, relative to ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    data = control_vector(plan, facts, command)
    tmp = os.path.join(out_dir, f".{FILE_NAME}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, os.path.join(out_dir, FILE_NAME))
    return [FILE_NAME]
