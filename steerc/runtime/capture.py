"""What a capture reads, whatever the engine (spec/derive.md, *Capture*): sites, texts, positions and the
arrays they give. numpy only; the engines are :func:`steerc.runtime.hf.capture` (transformers, in
process) and :func:`steerc.runtime.vllm.capture` (inside a vLLM engine), which share this module, so a
text is read at the same tokens on both.

* ``sites``: a selector as a ``.steer`` file writes it (``resid_post[0:30]``, ``mlp_out[4]``,
  ``head[5, 0:3]``), checked against the model's facts (:func:`sites_of`);
* ``texts``: strings, or ``(prompt, text)`` pairs / ``{"prompt", "text"}`` maps, tokenized as
  :func:`encode` says (the prompt and the text separately, then joined, so no token straddles them);
* ``read``: ``last`` (the last token), ``mean`` (every token), ``completion`` (the mean over the text's own
  tokens, after its prompt: all of them for a text without one) or ``all`` (every token kept).

The answer, :class:`Captured`: ``{site text: float32 array}`` in the texts' order, ``[texts, width]``, or
for ``all`` ``[texts, longest, width]`` padded on the right with zeros (a text's rows past its own
tokens are zero, never another text's), with ``lengths`` saying how many rows of each text are read.
"""

from __future__ import annotations

import os

import numpy as np

from steerc.core.limits import MAX_TEXT_TOKENS, text_tokens_limit
from steerc.core.record import frozen
from steerc.diagnostics import Refusal
from steerc.diagnostics.codes import INVALID_DATA, INVALID_VALUE

READS = ("last", "mean", "completion", "all")
SITE_PROGRAM = "steer 1\nintervention derive {{\n  at {at}\n  scale 2\n}}\n"
MAX_TEXTS = 1_000_000
MAX_ALL_BYTES = 2 << 30  # what a read=all capture may hold: texts x longest x width x 4 bytes, every site


class CaptureError(Refusal):
    """A capture request steerc refuses before any forward (its diagnostics say why)."""


def error(code: str, message: str, help: str | None = None) -> CaptureError:
    from steerc.diagnostics import Diagnostic

    return CaptureError([Diagnostic.error(code, message, None, help=help)])


@frozen
class Site:
    kind: str
    layer: int  # as written (a bank's row)
    head: int | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}.{self.layer}" + (f".{self.head}" if self.head is not None else "")

    @property
    def text(self) -> str:
        return f"head[{self.layer}, {self.head}]" if self.kind == "head" else f"{self.kind}[{self.layer}]"


class Captured(dict):
    """``{site text: float32 array}`` (see the module), with ``read``, ``sites`` (:class:`Site`, in order) and
    ``lengths`` (int64 ``[texts]``: the tokens each text was read at)."""

    def __init__(self, arrays: dict, sites, read: str, lengths):
        super().__init__(arrays)
        self.sites = list(sites)
        self.read = read
        self.lengths = np.asarray(lengths, dtype=np.int64)


def sites_of(at, facts, label: str = "sites", one_per_layer: bool = False) -> list[Site]:
    """The concrete sites of a selector such as ``resid_post[25%:75%]``, in order (raises CaptureError whose
    diagnostics point into the selector, shown as a one-line program named ``label``). With
    ``one_per_layer`` (a bank's rows), at most one head per layer."""
    from steerc.api import check_source
    from steerc.passes.lower_plan import concrete_sites

    if not isinstance(at, str) or not at.strip() or any(c in at for c in "\n\r{}#"):
        raise error(INVALID_VALUE, f"{label} takes one site selector, e.g. resid_post[4:8], got {at!r}")
    result = check_source(SITE_PROGRAM.format(at=at), label, facts=facts)
    errors = [d for d in result.diagnostics if d.is_error]
    if errors:
        raise CaptureError(errors, result.sources)
    site = result.checked.interventions[0].site
    pairs = list(concrete_sites(site, facts))
    layers = [layer for layer, _ in pairs]
    if one_per_layer and len(set(layers)) != len(layers):
        raise error(INVALID_VALUE, f"{label}: one head per layer (a bank holds one row per layer), "
                    "e.g. head[4:8, 3]")
    return [Site(site.kind, layer, head) for layer, head in pairs]


def as_sites(sites, facts) -> list[Site]:
    """:class:`Site` objects from a selector string, a list of selectors, or Sites (duplicates dropped)."""
    if isinstance(sites, str):
        sites = [sites]
    out: list[Site] = []
    for s in sites:
        out += [s] if isinstance(s, Site) else sites_of(s, facts)
    if not out:
        raise error(INVALID_VALUE, "no sites to read")
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------------ tokens


def encode(tokenizer, text: str, prompt: str | None, chat: bool) -> tuple[list[int], int]:
    """(token ids, where the text starts: 0 without a prompt). The prompt (in the chat template with
    ``chat``, as a user turn with the generation prompt) and the text are tokenized separately."""
    templated = chat and getattr(tokenizer, "chat_template", None)
    if prompt is None:
        if templated:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True)
        else:
            ids = tokenizer(text)["input_ids"]
        return list(_ids(ids)), 0
    if templated:
        head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=True)
    else:
        head = tokenizer(prompt)["input_ids"]
    head = list(_ids(head))
    tail = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return head + tail, len(head)


def _ids(value):
    """Token ids from what a tokenizer call returned (a list, or a mapping with ``input_ids``)."""
    if isinstance(value, dict) or hasattr(value, "keys"):
        value = value["input_ids"]
    return value


def positions(n: int, start: int, read: str) -> tuple[int, int]:
    """[a, b) of the tokens a text of ``n`` tokens, its own starting at ``start``, is read at."""
    if read == "last":
        return n - 1, n
    if read == "completion":
        return start, n
    return 0, n


def text_pairs(texts) -> list[tuple[str | None, str]]:
    """(prompt or None, text) per text: from strings, (prompt, text) pairs or {"prompt", "text"} maps."""
    if isinstance(texts, str):
        raise error(INVALID_DATA, "texts is one string: give a list of texts")
    out = []
    for i, t in enumerate(texts):
        if isinstance(t, str):
            out.append((None, t))
        elif isinstance(t, dict) and isinstance(t.get("text"), str) and isinstance(t.get("prompt"), (str, type(None))):
            out.append((t.get("prompt"), t["text"]))
        elif isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(x, str) for x in t):
            out.append((t[0], t[1]))
        else:
            raise error(INVALID_DATA, f"texts[{i}] is a {type(t).__name__}: give a string, a (prompt, text) "
                        'pair or {"prompt": ..., "text": ...}')
        if len(out) > MAX_TEXTS:
            raise error(INVALID_DATA, f"more than {MAX_TEXTS} texts in one capture")
    return out


def items_of(tokenizer, texts, read: str, chat: bool, *, context: int | None = None, spans=None,
             sources=None) -> list[tuple[list[int], int, int]]:
    """(token ids, a, b) per text: the tokens ``[a, b)`` it is read at (raises CaptureError).

    Each text's tokens (its prompt and chat template included) are bounded by the model's ``context`` (None:
    not known) and MAX_TEXT_TOKENS, checked as each is tokenized, before any forward: characters bound the
    text, not its tokens (an emoji is several). ``spans[i]`` (into ``sources``) says where text ``i`` was
    written, for the diagnostic."""
    if read not in READS:
        raise error(INVALID_VALUE, f"read {read!r}: one of {', '.join(READS)}")
    limit = text_tokens_limit(context)
    out = []
    for i, (prompt, text) in enumerate(text_pairs(texts)):
        ids, start = encode(tokenizer, text, prompt, chat)
        span = spans[i] if spans is not None and i < len(spans) else None
        if len(ids) > limit:
            raise CaptureError([too_many_tokens(len(ids), context, span, f"texts[{i}]")], sources)
        a, b = positions(len(ids), start, read)
        if b <= a or a < 0:
            raise error(INVALID_DATA, f"texts[{i}] has no tokens to read (read {read})")
        out.append((ids, a, b))
    return out


def config_context(model_path: str) -> int | None:
    """The context of the model at ``model_path`` (a name, a folder, a cached ``.gguf``), in tokens, from its
    ``config.json`` alone, before any weights load; None where the config cannot say without the load."""
    from steerc.core.jsonio import JSONError, read_file
    from steerc.core.limits import context_of
    from steerc.facts.named import named_config
    from steerc.runtime.models import config_source

    source = config_source(model_path)
    if source is None:
        return None
    path = named_config(source)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        _, config = read_file(file)
    except (OSError, JSONError):
        return None
    return context_of(config) if isinstance(config, dict) else None


def too_many_tokens(n: int, context: int | None, span=None, what: str = "this text"):
    """The ``invalid-data`` diagnostic of a text of ``n`` tokens, over what a model of ``context`` tokens (None:
    not known) reads at once; at ``span`` (its line in the data file) where there is one, else naming ``what``."""
    from steerc.diagnostics import Diagnostic

    limit = text_tokens_limit(context)
    why = f"the model's context of {context:,}" if limit == context else f"the {MAX_TEXT_TOKENS:,} (MAX_TEXT_TOKENS)"
    lead = "this text" if span is not None else what
    return Diagnostic.error(INVALID_DATA, f"{lead} is {n:,} tokens, over {why} that steerc reads in one text",
                            span, help="split it into shorter texts (characters do not bound tokens: an emoji "
                            "is several)")


def check_size(items, sites, facts, read: str) -> None:
    """A read=all capture's arrays must fit :data:`MAX_ALL_BYTES` (raises CaptureError, before any forward)."""
    if read != "all" or not items:
        return
    longest = max(b - a for _, a, b in items)
    size = len(items) * longest * sum(facts.width(s.kind) for s in sites) * 4
    if size > MAX_ALL_BYTES:
        raise error(INVALID_VALUE, f"read all would keep {size / 2**30:.1f} GiB ({len(items)} texts x {longest} "
                    f"tokens x {len(sites)} sites), over the {MAX_ALL_BYTES >> 30} GiB a capture holds",
                    help="read fewer texts or sites at a time, or read last or mean")


def padded(flat: np.ndarray, items) -> np.ndarray:
    """``[texts, longest, width]`` from every text's rows one after the other (``[sum of (b - a), width]``),
    each text's rows padded on the right with zeros."""
    lengths = [b - a for _, a, b in items]
    out = np.zeros((len(items), max(lengths, default=0), flat.shape[-1]), dtype=np.float32)
    at = 0
    for i, n in enumerate(lengths):
        out[i, :n] = flat[at:at + n]
        at += n
    return out


def captured(arrays: dict, sites, items, read: str) -> Captured:
    """The :class:`Captured` answer from ``{Site: array}`` (per text, or for ``all`` every position flat)."""
    if read == "all":
        arrays = {s: padded(a, items) for s, a in arrays.items()}
    return Captured({s.text: arrays[s] for s in sites}, sites, read, [b - a for _, a, b in items])
