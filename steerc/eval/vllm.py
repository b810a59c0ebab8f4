"""``steerc eval --engine vllm``: the items scored by the vllm target's engine (spec/eval.md §11).

One engine for the whole run, booted once with the first point's plan:

* every sequence is sent whole as its prompt, with ``prompt_logprobs`` (0 for
  a behaviour completion: the log-probability of each of its tokens; the
  full distribution for a cost text, which the KL needs) and
  ``extra_args["steerc_prompt_len"]``: the worker then treats the
  completion's positions as generated ones, as the HF runtime's
  ``teacher_forced`` does, so ``tokens generated``, schedules and pooled
  gates mean what they mean in ``steerc eval --engine hf``;
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

from steerc.eval.score import Sequence

# Full distributions cost vLLM one Python object per vocabulary entry per position: a batch of cost
# texts holds at most this many scored positions (about 0.5 GB for SmolLM2's 49,152 entries).
FULL_POSITIONS = 64
BATCH_SEQUENCES = 64


class VLLMEngine:
    """Scores requests through a steered ``vllm.LLM`` (the interface of :class:`steerc.eval.score.HFEngine`)."""

    name = "vllm"

    def __init__(self, folder: str, tokenizer, facts, first_plan, **engine_kwargs):
        from steerc.runtime.vllm import checkpoint_dtype, enable, load, logs_to_stderr

        logs_to_stderr()
        from steerc.targets.vllm.emit import plan_bytes

        self.tokenizer, self.facts = tokenizer, facts
        self._plan_bytes = plan_bytes
        data = plan_bytes(first_plan, facts)
        engine_kwargs.setdefault("dtype", checkpoint_dtype(folder))
        self.llm = load(folder, data, enforce_eager=True, enable_prefix_caching=False, max_logprobs=-1,
                        **engine_kwargs)
        self._installed = data
        self.vocab = int(self.llm.llm_engine.model_config.get_vocab_size())
        enable(self.llm, False)

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()

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
        import vllm
        from vllm.inputs import TokensPrompt

        from steerc.runtime.vllm.engine import PROMPT_LEN_KEY

        prompts, params = [], []
        for seqs, full in chunk:
            for i, s in enumerate(seqs):
                prompts.append(TokensPrompt(prompt_token_ids=list(s.ids)))
                params.append(vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                                  prompt_logprobs=-1 if full and i == 0 else 0,
                                                  extra_args={PROMPT_LEN_KEY: s.plen}))
        outputs = iter(self.llm.generate(prompts, params, use_tqdm=False))
        for seqs, full in chunk:
            yield [self._scores(s, next(outputs).prompt_logprobs, full and i == 0) for i, s in enumerate(seqs)]

    def _scores(self, seq: Sequence, logprobs, full: bool):
        import numpy as np
        import torch

        total = 0.0
        rows = []
        for position in range(seq.plen, len(seq.ids)):
            entry = logprobs[position]
            total += float(entry[seq.ids[position]].logprob)
            if full:
                row = np.full(self.vocab, -np.inf)
                row[np.fromiter(entry.keys(), np.int64, len(entry))] = np.fromiter(
                    (v.logprob for v in entry.values()), np.float64, len(entry))
                rows.append(row)
        return total, (torch.from_numpy(np.stack(rows)) if full else None)

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
