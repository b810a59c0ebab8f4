"""A steered response's receipt: what its plan did to that request, read from the worker's own state.

A request that asks (``"steerc_receipt": true``) gets a ``steerc`` object in
its response (the last chunk, when streaming): the plan's id and the request's
``cache_salt``, the param values it ran with, and, from the tokens the model
computed (the prompt, then each generated token fed back):

* per intervention, how many prompt and generated tokens it steered;
* per gate, whether it opened, where it held, and per comparison the probe's
  value (pooled: the held value) and its threshold.

The worker computes it after every forward pass of that request with the
recorder behind ``steerc run --show-gates`` (:mod:`steerc.runtime.trace`),
reading the request's own buffers and the masks its kernels used, so the
numbers are those of HF for the same plan and prompt. It writes the receipt,
whole, to ``<receipts folder>/<id>.json`` (atomically, after each of the
request's steps: before vLLM sees the step's output); the HTTP front end, which
chose the id, reads it once the response is complete and deletes it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np
import torch

from steerc.core.paths import temp_folder
from steerc.runtime import kernels as S
from steerc.runtime.trace import GateRecorder, gates_json
from steerc.targets.serve.request import RECEIPT_ID

STALE_SECONDS = 3600  # receipts nobody read (an aborted request) are removed after this


def receipts_folder() -> str:
    return os.environ.get("STEERC_RECEIPTS") or temp_folder("receipts")


def receipt_path(rid: str) -> str:
    if not RECEIPT_ID.fullmatch(rid):
        raise ValueError(f"{rid[:40]!r} is not a receipt id")
    return os.path.join(receipts_folder(), f"{rid}.json")


class _StateView:
    """The context :class:`~steerc.runtime.trace.GateRecorder` reads, over one request's
    :class:`~steerc.runtime.vllm.steer.SteerState` after a forward (one row of ``n`` tokens)."""

    def __init__(self, state, pos, plen):
        n = self.n = len(pos)
        self.state = state
        self.pos = torch.as_tensor(np.asarray(pos)).reshape(1, n)
        self.plen = torch.as_tensor(np.asarray(plen)).reshape(1, n)
        self.real = torch.ones(1, n, dtype=torch.bool)
        self.values = {name: getattr(state, f"tok_{name}")[:n].reshape(1, n) for name in state.per_token}
        self.held = {name: getattr(state, f"held_{name}")[:1] for name in state.pooled}

    def scope_mask(self, scope):
        return self.state.scope_mask(scope, self.n).reshape(1, self.n)

    def gate_mask(self, gate):
        """[1, n] bool of a plan's gate: the shared evaluator (:func:`~steerc.runtime.kernels.evaluate_gate`)
        over the request's probe values, each threshold as the kernels hold it (float32, then the compute
        dtype)."""
        return S.evaluate_gate(gate, lambda name: self.state.probe_value(name, self.n).reshape(1, self.n),
                               lambda x: torch.tensor(np.float32(x)).to(self.state.dtype))


class Receipt:
    """The receipt of one steered request, kept up to date by the worker that holds its first rank."""

    def __init__(self, rid: str, admitted):
        self.path = receipt_path(rid)
        # At the request's own values: rebinding a plan to no values puts each per-request param at its default.
        self.recorder = GateRecorder(admitted.plan, admitted.params)
        self.head = {"plan": {"id": admitted.plan_id, "cache_salt": admitted.salt},
                     "params": dict(sorted(admitted.params.items()))}
        self.failed: str | None = None

    def fail(self, why: str) -> None:
        """This request can have no receipt: say why, once, and record nothing more."""
        self.failed = why
        self.write(dict(self.head, error=f"no receipt: {why}"))

    def restart(self) -> None:
        """The request is recomputed from its first token (after preemption): count afresh."""
        self.recorder.rows = None

    @torch.no_grad()
    def record(self, state, pos, plen) -> None:
        if self.failed is not None:
            return
        try:
            self.recorder.record(_StateView(state, pos, plen))
            doc = self.document()
        except Exception as exc:  # noqa: BLE001 - the receipt says it failed; the request's steering is unaffected
            doc = dict(self.head, error=f"the receipt could not be computed: {type(exc).__name__}: {exc}"[:500])
        self.write(doc)

    def document(self) -> dict:
        row = (self.recorder.report() or [None])[0]
        if row is None:
            return dict(self.head, positions=0, interventions=[], gates=[])
        return dict(self.head, positions=row["positions"], interventions=row["interventions"],
                    gates=gates_json(row)["gates"])

    def write(self, doc: dict) -> None:
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".incoming-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, sort_keys=True, allow_nan=False)
        os.replace(tmp, self.path)


def take(rid: str) -> dict | None:
    """The front end's side: the receipt written for ``rid`` (None if none was), removed once read; stale
    receipts of requests that never completed are swept on the way."""
    path = receipt_path(rid)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        doc = None
    try:
        os.remove(path)
    except OSError:
        pass
    _sweep(os.path.dirname(path))
    return doc


def _sweep(folder: str) -> None:
    cutoff = time.time() - STALE_SECONDS
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for name in entries:
        p = os.path.join(folder, name)
        try:
            if os.stat(p).st_mtime < cutoff:
                os.remove(p)
        except OSError:
            pass
