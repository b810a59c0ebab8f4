"""Teacher-forced scores of eval items on a transformers model, steered by installed plans (torch, lazily).

Each item becomes token sequences whose first ``plen`` tokens are the prompt
and whose other tokens are scored as a completion (spec/eval.md, *Tokens*):

* a behaviour item gives two, prompt + positive and prompt + negative;
* a cost item gives one, prompt + text, or the text alone with its first
  token as the prompt.

One forward per sequence under :meth:`~steerc.runtime.hooks.Handle.teacher_forced`
gives each completion token's log-probability as generating it would (the
completion's positions are generated positions for scopes, schedules and
gates). Unsteered forwards run once and are reused by every point of a sweep:
the behaviour sums always, the cost texts' next-token distributions while
they fit ``cache_bytes`` (past it, each point recomputes the unsteered
distribution of the texts that did not fit, one at a time).
"""

from __future__ import annotations

import contextlib

from steerc.core.limits import MAX_PROMPT_TOKENS
from steerc.core.record import frozen
from steerc.eval.data import Item

CACHE_BYTES = 512 * 1024 * 1024


class EvalError(Exception):
    """An item that cannot be scored (``line``: its line in the data file)."""

    def __init__(self, message: str, line: int, help: str | None = None):
        super().__init__(message)
        self.message, self.line, self.help = message, line, help


@frozen
class Sequence:
    ids: tuple[int, ...]
    plen: int  # the prompt's tokens; ids[plen:] are scored


def sequences(item: Item, tokenizer, chat: bool) -> tuple[Sequence, ...]:
    """The token sequences of one item (raises EvalError when one has nothing to score or is too long)."""
    from steerc.runtime.models import encode_prompt

    def completion(prompt_ids: list[int], text: str) -> Sequence:
        ids = prompt_ids + list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return Sequence(tuple(ids), len(prompt_ids))

    if item.prompt is not None:
        prompt_ids = [int(t) for t in encode_prompt(tokenizer, item.prompt, chat)["input_ids"][0]]
        texts = (item.positive, item.negative) if item.kind == "behavior" else (item.text,)
        seqs = tuple(completion(prompt_ids, t) for t in texts)
    else:
        ids = tuple(int(t) for t in tokenizer(item.text)["input_ids"])
        seqs = (Sequence(ids, 1),)
    for s in seqs:
        if len(s.ids) <= s.plen:
            raise EvalError("the text is a single token: nothing after it to score" if item.prompt is None
                            else "a completion tokenizes to no tokens", item.line,
                            help="give the text a prompt, or a longer text")
        if len(s.ids) > MAX_PROMPT_TOKENS:
            raise EvalError(f"{len(s.ids)} tokens, over the {MAX_PROMPT_TOKENS} steerc eval scores in one sequence",
                            item.line, help="shorten the prompt or the text")
    return seqs


def forward(model, seq: Sequence, handle=None):
    """(sum of the completion's token log-probabilities, the log-distributions that predicted them
    [completion tokens, vocab], float64)."""
    import torch

    ids = torch.tensor([seq.ids], dtype=torch.long)
    forced = handle.teacher_forced([seq.plen]) if handle is not None else contextlib.nullcontext()
    with torch.no_grad(), forced:
        logits = model(input_ids=ids, use_cache=False).logits[0]
    logp = torch.log_softmax(logits[seq.plen - 1:-1].double(), dim=-1)
    target = ids[0, seq.plen:]
    return float(logp.gather(1, target.unsqueeze(1)).sum()), logp


def kl(unsteered, steered) -> float:
    """Mean over positions of KL(p_unsteered || p_steered), from log-distributions [positions, vocab]."""
    return float((unsteered.exp() * (unsteered - steered)).sum(dim=-1).mean())


class HFEngine:
    """``--engine hf``: the HF runtime, one teacher-forced forward per sequence.

    An engine scores requests ``(sequences, full)`` under its current steering: per request, per
    sequence, (log-probability sum of the completion, its log-distributions [completion tokens, vocab]
    when ``full`` asks for the first sequence's, else None); :meth:`steering` puts one point's plan on,
    :meth:`unsteered` takes it off for a moment."""

    name = "hf"

    def __init__(self, model, tokenizer, name: str = "hf"):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.vocab = int(model.config.vocab_size)
        self.handle = None
        self._point = None

    def score(self, requests):
        for seqs, full in requests:
            results = [forward(self.model, s, self.handle) for s in seqs]
            yield [(total, logp if full and i == 0 else None) for i, (total, logp) in enumerate(results)]

    @contextlib.contextmanager
    def steering(self, point):
        from steerc.runtime.hf import install

        self._point = point
        self.handle = install(self.model, point.plan, self.tokenizer)
        try:
            yield self
        finally:
            self.handle.remove()
            self.handle = self._point = None

    @contextlib.contextmanager
    def unsteered(self):
        from steerc.runtime.hf import install

        point, handle = self._point, self.handle
        if handle is not None:
            handle.remove()
            self.handle = None
        try:
            yield self
        finally:
            if handle is not None:
                self.handle = install(self.model, point.plan, self.tokenizer)


def _vllm(session):
    from steerc.eval.vllm import VLLMEngine

    return VLLMEngine(session)


# The scoring engine of each engine of steerc.runtime.engines that runs the model outside this process, by
# its name; an engine whose session holds a transformers model here is scored by HFEngine.
SCORERS = {"vllm": _vllm}


def engine_on(name: str, session):
    """The scoring engine of ``steerc eval --engine name`` on its booted session (spec/eval.md §9)."""
    own = SCORERS.get(name)
    if own is not None:
        return own(session)
    if session.model is None:
        raise LookupError(f"the engine {name} runs its model elsewhere and has no scorer in SCORERS")
    return HFEngine(session.model, session.tokenizer, name=name)


class Scorer:
    """The items of one data file on one engine: unsteered once, then each point's steered scores."""

    def __init__(self, engine, items: tuple[Item, ...], chat: bool, cache_bytes: int = CACHE_BYTES,
                 progress=None):
        self.engine, self.items = engine, items
        self.seqs = [sequences(item, engine.tokenizer, chat) for item in items]
        self.progress = progress or (lambda n: None)
        budget = cache_bytes
        self.sums: list[tuple[float, ...]] = []  # unsteered log-prob sums per sequence of each item
        self.cached: list = []  # per item: its cost distribution (float32), or None (recomputed per point)
        for item, results in zip(items, engine.score(self._requests(range(len(items))))):
            self.sums.append(tuple(r[0] for r in results))
            keep = None
            if item.kind == "cost":
                size = results[0][1].shape[0] * engine.vocab * 4
                if size <= budget:
                    budget -= size
                    keep = results[0][1].float()
            self.cached.append(keep)
            self.progress(1)

    def _requests(self, indices, full: bool = True):
        return [(self.seqs[i], full and self.items[i].kind == "cost") for i in indices]

    def unsteered(self) -> tuple[list[float], list[tuple[float, float]]]:
        """Behaviour scores, and (NLL sum, tokens) of each cost item, without steering."""
        behavior, cost = [], []
        for item, seqs, sums in zip(self.items, self.seqs, self.sums):
            if item.kind == "behavior":
                behavior.append(sums[0] - sums[1])
            else:
                cost.append((-sums[0], len(seqs[0].ids) - seqs[0].plen))
        return behavior, cost

    def point(self, point) -> tuple[list[tuple[float, float]], list[tuple[float, float, float, float]]]:
        """Steered scores at ``point`` (a :class:`steerc.eval.Point`).

        (steered, unsteered) behaviour scores per behaviour item; (mean KL, steered NLL, unsteered NLL,
        tokens) per cost item, in file order. A cost item whose unsteered distribution did not fit the
        cache is scored after the others, its unsteered distribution computed again with the steering off."""
        scores: dict[int, tuple] = {}
        with self.engine.steering(point):
            ready = [i for i in range(len(self.items)) if self.items[i].kind == "behavior" or self.cached[i] is not None]
            for i, results in zip(ready, self.engine.score(self._requests(ready))):
                scores[i] = self._scores(i, results, self.cached[i])
                self.progress(1)
            for i in (i for i in range(len(self.items)) if i not in scores):
                with self.engine.unsteered():
                    (reference,), = list(self.engine.score(self._requests([i])))
                (results,) = list(self.engine.score(self._requests([i])))
                scores[i] = self._scores(i, results, reference[1])
                self.progress(1)
        behavior = [scores[i] for i in range(len(self.items)) if self.items[i].kind == "behavior"]
        cost = [scores[i] for i in range(len(self.items)) if self.items[i].kind == "cost"]
        return behavior, cost

    def _scores(self, i: int, results, reference) -> tuple:
        sums, seqs = self.sums[i], self.seqs[i]
        if self.items[i].kind == "behavior":
            return results[0][0] - results[1][0], sums[0] - sums[1]
        total, logp = results[0]
        # both sides rounded to float32 as the cache keeps them: unchanged logits give KL 0 exactly
        return (kl(reference.float().double(), logp.float().double()), -total, -sums[0],
                len(seqs[0].ids) - seqs[0].plen)
