"""Small exact-as-possible linear algebra for folding directions.

>>> import numpy as np
>>> q = orthonormal_basis([np.array([1.0, 1.0, 0.0]), np.array([2.0, 2.0, 0.0]), np.array([0.0, 0.0, 3.0])])
>>> len(q), bool(np.allclose(q[0] @ q[1], 0.0))
(2, True)
"""

from __future__ import annotations

import numpy as np

RANK_TOL = 1e-6


def orthonormal_basis(vectors) -> list[np.ndarray]:
    """Gram-Schmidt (twice, for stability) in float64; dependent vectors are dropped."""
    basis: list[np.ndarray] = []
    for v in vectors:
        v = np.asarray(v, dtype=np.float64)
        scale = float(np.linalg.norm(v))
        if scale == 0.0:
            continue
        r = v.copy()
        for _ in range(2):
            for q in basis:
                r -= (q @ r) * q
        n = float(np.linalg.norm(r))
        if n > RANK_TOL * scale:
            basis.append(r / n)
    return basis


def plane(b1, b2) -> tuple[np.ndarray, np.ndarray]:
    """(e1, e2): e1 = b1/|b1|, e2 the unit part of b2 orthogonal to e1."""
    e1 = np.asarray(b1, dtype=np.float64)
    e1 = e1 / np.linalg.norm(e1)
    r = np.asarray(b2, dtype=np.float64) - (e1 @ b2) * e1
    return e1, r / np.linalg.norm(r)
