"""The TOML reader: the standard library's ``tomllib`` (Python 3.11+), else ``tomli``, its original."""

from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["tomllib"]
