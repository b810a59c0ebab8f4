"""The file `steerc derive` writes: a per-layer bank as safetensors, with its provenance in the metadata.

Tensors, all float32: ``<method>.<layer>`` for each method and each layer
read (``mean_diff.8``: a ``[d]`` row), so ``load("joy.safetensors",
key="mean_diff", per_layer=true)`` gives each selected layer its row and
``load(..., key="mean_diff.8")`` one row; ``logistic`` adds
``logistic_bias.<layer>`` (``[1]``, the ``b`` of ``dot(w) + b``).

The safetensors metadata holds one entry, ``steerc.derive``: canonical JSON
(sorted keys) recording the format, the steerc version, the model (layout
fingerprint, family, size, weights sha256), the site kind, layers and head,
the methods, how texts were read (positions, chat template), whether rows
were normalised, the dataset (sha256, pair count, files), the held-out split
and every layer's held-out AUROC per method. ``steerc check`` reads it back
(:func:`steerc.io.provenance.provenance`) to warn when a vector meets another model or another
site than it was made for. The same inputs give the same bytes.
"""

from __future__ import annotations

import numpy as np

from steerc.core.jsonio import canonical  # strict JSON, as provenance() reads it back (spec/json.md)
from steerc.io.provenance import FORMAT, METADATA_KEY, provenance  # noqa: F401  (provenance: the reader)


def write(path: str, rows: dict[str, np.ndarray], info: dict) -> None:
    """Write ``rows`` ({tensor name: array}) with ``info`` as the provenance metadata, atomically."""
    write_arrays(path, rows, METADATA_KEY, {"format": FORMAT, **info})


def write_arrays(path: str, arrays: dict[str, np.ndarray], key: str, info: dict) -> None:
    """``arrays`` as safetensors (sorted by name; float32, integer arrays as int64) with ``info`` as canonical
    JSON under the metadata entry ``key``, written atomically: the same inputs give the same bytes
    (``steerc capture`` too)."""
    import os
    import tempfile

    from safetensors.numpy import save

    data = save({k: np.ascontiguousarray(v, dtype=np.int64 if np.asarray(v).dtype.kind in "iu" else np.float32)
                 for k, v in sorted(arrays.items())},
                metadata={key: canonical(info)})
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:  # no temporary file left behind, whatever failed
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
