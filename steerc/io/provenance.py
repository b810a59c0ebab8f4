"""The provenance `steerc derive` writes into a bank's safetensors metadata, read back.

One metadata entry, ``steerc.derive``, holds canonical JSON (the format is
:data:`FORMAT`); :mod:`steerc.derive.bank` writes it and ``steerc check``
reads it to warn when a vector meets another model or another site than it
was made for (``vector-model-mismatch``, ``vector-site-mismatch``).

>>> provenance({"steerc.derive": '{"format": "steerc.derive/1", "site": "resid_post"}'})["site"]
'resid_post'
>>> provenance({"other": "x"}) is None
True
"""

from __future__ import annotations

from steerc.core.jsonio import JSONError, loads

FORMAT = "steerc.derive/1"
METADATA_KEY = "steerc.derive"


def provenance(metadata: dict | None) -> dict | None:
    """The recorded provenance of a safetensors file's metadata, or None (not written by derive, or
    unreadable: provenance is advisory, never an error)."""
    if not metadata or METADATA_KEY not in metadata:
        return None
    try:
        value = loads(metadata[METADATA_KEY])
    except (JSONError, TypeError):
        return None
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        return None
    return value
