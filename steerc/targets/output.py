"""Writing a target's files: each atomically (a temporary file, then a rename), in the order given."""

from __future__ import annotations

import os


def write_files(out_dir: str, blobs: dict[str, bytes], folders: tuple[str, ...] = ()) -> list[str]:
    """Write ``{name relative to out_dir: bytes}``, making their folders and ``folders`` (even when
    empty); returns the names, in order."""
    for folder in folders:
        os.makedirs(os.path.join(out_dir, folder), exist_ok=True)
    for name, data in blobs.items():
        path = os.path.join(out_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    return list(blobs)
