"""The serve plugin's logits processor: the offline API's admission, and the end of a request that failed.

vLLM takes it by import path (``--logits-processors
steerc.runtime.serve:SteercGuard``; ``steerc serve`` passes it). It has two
jobs, one on each side of the engine:

* before a request is queued (:meth:`SteercGuard.validate_params`, in the
  front end): the offline API's (``vllm.LLM``) admission, where no HTTP
  middleware runs. The front end does not hold the model, so the plan is
  checked against the facts it was compiled for (:func:`admit_without_model`);
  the worker checks the model;
* in the worker, each step: a request whose steering the worker refused
  (:data:`FAILED_KEY` in its ``extra_args``, set by :mod:`.router`) is ended
  at its next token, with only its end-of-sequence token possible, so it
  never runs unsteered.
"""

from __future__ import annotations

from steerc.facts import ModelFacts
from steerc.runtime.vllm.store import ArtifactStore
from steerc.targets.serve.admission import MAX_PLAN_CHARS, RequestError, admit, decode_json
from steerc.targets.serve.request import PLAN_KEY
from steerc.targets.signing import env_key

FAILED_KEY = "steerc_failed"  # in a request's extra_args: why the worker refused it (the guard ends it)


def _guard_base():
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor
    except ImportError:  # outside vLLM: the class still documents and tests its admission
        return object
    return LogitsProcessor


class SteercGuard(_guard_base()):
    """vLLM logits processor (``--logits-processors steerc.runtime.serve:SteercGuard``).

    * ``validate_params`` (front end, before a request is queued): the
      offline API's admission — the plan, its artifacts and the model are
      checked, and a bad request is refused with its field named (vLLM turns
      the ``ValueError`` into HTTP 400 on a server).
    * In the worker: a request whose steering failed to build there is
      ended at its next token (only its end-of-sequence token stays
      possible), so it never runs unsteered.
    """

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        extra = getattr(sampling_params, "extra_args", None)
        if not extra or not any(isinstance(k, str) and k.startswith("steerc_") for k in extra):
            return
        try:
            admit_without_model(extra)
        except RequestError as exc:
            raise ValueError(str(exc)) from None

    def __init__(self, vllm_config, device, is_pin_memory):
        eos = getattr(vllm_config.model_config.hf_config, "eos_token_id", None)
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.rows: dict[int, object] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, *_ in batch_update.added:
            self.rows[index] = params
        for a, b, direction in batch_update.moved:
            pa, pb = self.rows.pop(a, None), self.rows.pop(b, None)
            if pa is not None:
                self.rows[b] = pa
            if pb is not None and getattr(direction, "name", "") == "SWAP":
                self.rows[a] = pb

    def apply(self, logits):
        for index, params in self.rows.items():
            extra = getattr(params, "extra_args", None)
            if isinstance(extra, dict) and FAILED_KEY in extra and index < logits.shape[0]:
                keep = logits[index, self.eos].clone() * 0 if self.eos else None
                logits[index] = float("-inf")
                if keep is not None:
                    logits[index, self.eos] = keep
        return logits


def admit_without_model(extra: dict):
    """Admission where the model is not at hand (the offline API's front end): everything but the
    model is checked, against the facts the plan was compiled for; the worker checks the model.

    Where the worker runs in this same process, its admission of the request finds this one's work done
    (:func:`steerc.targets.serve.admission.admit` keeps each admitted plan, built, by its text and the
    model's facts, which for a plan it admits are the ones the plan states) and checks only what is the
    server's own: its key, its sites and its tensor-parallel ranks.
    """
    doc = decode_json(PLAN_KEY, extra.get(PLAN_KEY), MAX_PLAN_CHARS)
    try:
        facts = ModelFacts(**doc["model"]["facts"])
    except Exception:  # noqa: BLE001 - malformed: admit() names the field
        facts = ModelFacts("?", 1, 1, 1, 1, 1, 1, 1, False, False)
    return admit(extra, facts, store=ArtifactStore(), key=env_key())
