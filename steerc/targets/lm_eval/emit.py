"""``steerc compile --target lm-eval -o OUT``: writes ``OUT/steer.csv``, lm-eval's ``steer_path``."""

from __future__ import annotations

import os

from steerc.targets.lm_eval.lower import FILE, Refused, csv_bytes, rows_of


def emit(plan, facts, out_dir: str, command: str = "", key: bytes | None = None, result=None) -> list[str]:
    """Write the CSV (atomically) and return its name, relative to ``out_dir``. ``result`` is the CheckResult
    the plan came from: a row names its SAE's folder and feature index, which the plan (numbers only) does not
    keep. :class:`Refused` (nothing written) for what the CSV cannot say."""
    if result is None or result.plan is not plan:
        raise ValueError("the lm-eval target reads the checked program: emit(plan, facts, out, result=result)")
    data = csv_bytes(rows_of(result))
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".{FILE}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, os.path.join(out_dir, FILE))
    return [FILE]


__all__ = ["Refused", "emit"]
