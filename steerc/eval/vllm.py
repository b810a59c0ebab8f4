"""``steerc eval --engine vllm``: the items scored by the vllm target's engine (spec/eval.md §11).

One engine for the whole run, booted once with the first point's plan (the ``vllm`` entry of
:mod:`steerc.runtime.engines`, whose session this scores on and which shuts it down):

* every sequence is sent whole as its prompt, with
  ``extra_args["steerc_prompt_len"]``: the worker then treats the
  completion's positions as generated ones, as the HF runtime's
  ``teacher_forced`` does, so ``tokens generated``, schedules and pooled
  gates mean what they mean in ``steerc eval --engine hf``;
* a behaviour completion's token log-probabilities are vLLM's
  ``prompt_logprobs=0``; a cost text's full log-distributions (which the KL
  needs) are read by a per-position capture of the final hidden states,
  turned into log-distributions in the worker (``compute_logits``, then
  ``log_softmax``) and sent back as one float32 array;
* the unsteered pass runs with the steering switched off
  (:func:`steerc.runtime.vllm.enable`), in the same engine;
* a point of the same program writes its values in place
  (:func:`steerc.runtime.vllm.swap`), another program installs its structure
  (:func:`steerc.runtime.vllm.install`: the engine is eager, for that); the
  engine never reboots;
* prefix caching is off: a cached prefix would hold KV computed under
  another point's steering.

vLLM and torch are imported when an engine starts.
"""

from __future__ import annotations

import contextlib

# A batch of cost texts holds at most this many scored positions: their log-distributions come back from
# the worker as one float32 array (100 MB for SmolLM2's 49,152 entries).
FULL_POSITIONS = 512
BATCH_SEQUENCES = 64
# The capture site of the model's final hidden states, answered as log-distributions
# (steerc.runtime.vllm.activations).
LOGPROBS_SITE = {"key": "logprobs", "kind": "logprobs", "module": "", "tensor": "", "head": None, "columns": None}


class VLLMEngine:
    """Scores requests through a steered ``vllm.LLM`` (the interface of :class:`steerc.eval.score.HFEngine`)."""

    name = "vllm"

    def __init__(self, session):
        """On a booted :class:`steerc.runtime.engines.VLLMSession` (its engine stays the session's, shut down
        with it), the steering off until a point puts its plan on."""
        from steerc.runtime.vllm import enable
        from steerc.targets.vllm.emit import plan_bytes

        self.llm, self.tokenizer, self.facts = session.llm, session.tokenizer, session.facts
        self._plan_bytes = plan_bytes
        self._installed = session.installed
        self.vocab = int(self.llm.llm_engine.model_config.get_vocab_size())
        enable(self.llm, False)

    # ---- scoring
    def score(self, requests):
        """Per request (sequences, full), per sequence, (log-probability sum, log-distributions or None)."""
        chunk, positions = [], 0
        for seqs, full in requests:
            size = len(seqs[0].ids) - seqs[0].plen if full else 0
            if chunk and (len(chunk) >= BATCH_SEQUENCES or positions + size > FULL_POSITIONS):
                yield from self._run(chunk)
                chunk, positions = [], 0
            chunk.append((seqs, full))
            positions += size
        if chunk:
            yield from self._run(chunk)

    def _run(self, chunk):
        import numpy as np
        import torch
        import vllm
        from vllm.inputs import TokensPrompt

        from steerc.runtime.vllm import answer_array, captured
        from steerc.runtime.vllm.activations import CAPTURE_KEY
        from steerc.runtime.vllm.engine import PROMPT_LEN_KEY

        prompts, params, rows = [], [], []
        for seqs, full in chunk:
            for i, s in enumerate(seqs):
                extra = {PROMPT_LEN_KEY: s.plen}
                if full and i == 0:  # its distributions come from the capture, computed in the worker
                    extra[CAPTURE_KEY] = len(rows)
                    rows.append([s.plen - 1, len(s.ids) - 1])
                prompts.append(TokensPrompt(prompt_token_ids=list(s.ids)))
                params.append(vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                                  prompt_logprobs=None if CAPTURE_KEY in extra else 0,
                                                  extra_args=extra))
        if rows:
            spec = {"sites": [LOGPROBS_SITE], "rows": rows, "per_position": True}
            outputs, answers = captured(self.llm, spec, [(prompts, params)])
            dists = answer_array(answers, "logprobs", "the log-distributions")
        else:
            outputs, dists = self.llm.generate(prompts, params, use_tqdm=False), None
        outputs, offset = iter(outputs), 0
        for seqs, full in chunk:
            results = []
            for i, s in enumerate(seqs):
                out = next(outputs)
                if full and i == 0:
                    n = len(s.ids) - s.plen
                    logp = torch.from_numpy(dists[offset:offset + n].astype(np.float64))
                    offset += n
                    target = torch.tensor(s.ids[s.plen:], dtype=torch.long)
                    results.append((float(logp.gather(1, target.unsqueeze(1)).sum()), logp))
                else:
                    results.append((sum(float(out.prompt_logprobs[p][s.ids[p]].logprob)
                                        for p in range(s.plen, len(s.ids))), None))
            yield results

    # ---- steering
    @contextlib.contextmanager
    def steering(self, point):
        from steerc.runtime.vllm import enable, install, swap
        from steerc.targets.vllm.wire import boot_sha256, unpack

        data = self._plan_bytes(point.plan, self.facts)
        same = boot_sha256(unpack(data)["boot"]) == boot_sha256(unpack(self._installed)["boot"])
        (swap if same else install)(self.llm, data)
        self._installed = data
        enable(self.llm, True)
        try:
            yield self
        finally:
            enable(self.llm, False)

    @contextlib.contextmanager
    def unsteered(self):
        from steerc.runtime.vllm import enable

        enable(self.llm, False)
        try:
            yield self
        finally:
            enable(self.llm, True)
