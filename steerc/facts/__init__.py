"""Model layout facts: what the compiler knows about a model before weights load.

Facts come from a Hugging Face model folder or its ``config.json`` (no
weights are read), from a facts JSON written by ``steerc facts``, or from a
live transformers model. The fingerprint hashes the facts themselves, so a
config, its facts JSON and the loaded model all agree on it.

>>> facts = facts_from_config({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64,
...     "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512})
>>> facts.family, facts.layers, facts.head_dim, facts.tied_embeddings
('llama', 4, 16, False)
"""

from __future__ import annotations

import hashlib
import json
import os

from steerc.core.jsonio import JSONError, canonical
from steerc.core.jsonio import read_file as read_json_file
from steerc.core.limits import MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB
from steerc.core.record import field, frozen
from steerc.diagnostics.codes import INVALID_MODEL, UNKNOWN_FAMILY
from steerc.facts.families import FAMILIES, MODEL_TYPES
from steerc.facts.named import named_config, not_found
from steerc.facts.sites import site_table

FORMAT = "steerc.facts/1"
FACT_FIELDS = (
    "family", "layers", "hidden", "heads", "kv_heads", "head_dim",
    "intermediate", "vocab", "tied_embeddings", "parallel_residual",
)


INVALID = INVALID_MODEL


class FactsError(Exception):
    """The model description cannot be used. ``code`` set: report as a diagnostic."""

    def __init__(self, message: str, code: str | None = None, file: str | None = None,
                 text: str | None = None, needle: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.file = file
        self.text = text
        self.needle = needle  # a string to point at inside `text`


@frozen
class ModelFacts:
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    parallel_residual: bool
    model_type: str = field(default="", eq=False)
    origin: str = field(default="", eq=False)
    guesses: tuple[str, ...] = field(default=(), eq=False)

    @property
    def fingerprint(self) -> str:
        """sha256 of the layout facts in canonical JSON (what steering depends on)."""
        core = {k: getattr(self, k) for k in FACT_FIELDS}
        blob = canonical(core).encode()
        return hashlib.sha256(blob).hexdigest()

    def width(self, site_kind: str) -> int:
        return self.head_dim if site_kind == "head" else self.hidden

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in FACT_FIELDS}
        out["fingerprint"] = self.fingerprint
        return out


def _first(config: dict, keys: tuple[str, ...], default=None) -> tuple[str | None, object]:
    """(the key that gave the value, the value); (None, default) when no key is set."""
    for k in keys:
        if config.get(k) is not None:
            return k, config[k]
    return None, default


def _text_config(config: dict) -> dict:
    # Multimodal wrappers (e.g. Gemma-3) keep the language model's facts in text_config.
    inner = config.get("text_config")
    outer = config.get("model_type")
    if outer is not None and not isinstance(outer, str):
        raise FactsError(f"`model_type` must be a string, got {_shown(outer)}", code=INVALID, needle='"model_type"')
    if isinstance(inner, dict) and outer not in MODEL_TYPES:
        merged = dict(inner)
        merged.setdefault("model_type", inner.get("model_type") or config.get("model_type"))
        return merged
    if isinstance(inner, dict) and config.get("model_type") == "gemma3":
        return {**inner, "model_type": "gemma3_text"}
    return config


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Bounds of each fact: (least, most). Sizes are positive; a config silent on the vocabulary gives 0.
BOUNDS: dict[str, tuple[int, int]] = {
    "layers": (1, MAX_LAYERS),
    "hidden": (1, MAX_HIDDEN),
    "heads": (1, MAX_HEADS),
    "kv_heads": (1, MAX_HEADS),
    "head_dim": (1, MAX_HEAD_DIM),
    "intermediate": (1, MAX_INTERMEDIATE),
    "vocab": (0, MAX_VOCAB),
}


def _bounded(fact: str, value, where: str, key: str | None = None) -> int:
    """``value`` if it is a whole number within the bounds of ``fact`` (``where`` names it in messages,
    ``key`` is where it stands in the file)."""
    least, most = BOUNDS[fact]
    needle = f'"{key}"' if key else None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise FactsError(f"{where} must be a whole number >= {least}, got {_shown(value)}", code=INVALID,
                         needle=needle)
    if value > most:
        raise FactsError(f"{where} is {value:,}; steerc reads models of at most {most:,} (see spec/limits.md)",
                         code=INVALID, needle=needle)
    return value


def _count(config: dict, keys: tuple[str, ...], fact: str, what: str, default=None) -> int:
    key, value = _first(config, keys, default)
    if value is None:
        raise FactsError(f"the config does not give {what} ({' or '.join(keys) or 'no key'})", code=INVALID,
                         needle='"model_type"')
    return _bounded(fact, value, f"{what} ({key})" if key else f"{what} (default {default!r})", key)


def _flag(config: dict, key: str, default: bool) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FactsError(f"`{key}` must be true or false, got {_shown(value)}", code=INVALID, needle=f'"{key}"')
    return value


def _consistent(f: ModelFacts, names: dict[str, str], derived_head_dim: bool) -> ModelFacts:
    """Sizes that fit together: the heads tile the hidden state where the family says so, within bounds."""
    if derived_head_dim and (f.hidden % f.heads or f.head_dim != f.hidden // f.heads):
        raise FactsError(f"{names['hidden']} = {f.hidden} is not {names['heads']} = {f.heads} heads of "
                         f"head_dim = {f.head_dim}: this family's heads tile the hidden state", code=INVALID,
                         needle=f'"{names["heads"]}"')
    if f.heads * f.head_dim > MAX_HIDDEN:
        raise FactsError(f"{f.heads} heads of head_dim {f.head_dim} are {f.heads * f.head_dim:,} wide; steerc "
                         f"reads attention of at most {MAX_HIDDEN:,} (see spec/limits.md)", code=INVALID,
                         needle=f'"{names["heads"]}"')
    return f


def facts_from_config(config: dict, origin: str = "config") -> ModelFacts:
    """Facts from a parsed ``config.json`` (raises FactsError)."""
    original_type = config.get("model_type")
    config = _text_config(config)
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise FactsError(f"`model_type` must be a string, got {_shown(model_type)}", code=INVALID,
                         needle='"model_type"')
    family_name = MODEL_TYPES.get(model_type)
    if family_name is None:
        known = ", ".join(sorted(FAMILIES))
        raise FactsError(
            f"unknown model family `{model_type}`; steerc knows the layout of: {known}",
            code=UNKNOWN_FAMILY,
            needle='"model_type"',
        )
    fam = FAMILIES[family_name]
    layers = _count(config, fam.layers, "layers", "the number of layers")
    hidden = _count(config, fam.hidden, "hidden", "the hidden size")
    heads = _count(config, fam.heads, "heads", "the number of attention heads")
    kv_heads = _count(config, fam.kv_heads, "kv_heads", "the number of key-value heads",
                      fam.kv_heads_default or heads)
    explicit_hd = config.get("head_dim", fam.head_dim_default) if fam.head_dim_from_config else None
    if explicit_hd is not None:
        head_dim = _bounded("head_dim", explicit_hd, "head_dim", "head_dim")
    else:
        head_dim = hidden // heads
        if head_dim < 1:
            raise FactsError(f"the hidden size {hidden} is smaller than the {heads} attention heads it is split into",
                             code=INVALID, needle=f'"{(fam.heads or ("heads",))[0]}"')
    intermediate = _count(config, fam.intermediate, "intermediate", "the intermediate size",
                          fam.intermediate_default or 4 * hidden)
    vocab = _count(config, fam.vocab, "vocab", "the vocabulary size", 0)
    tied = _flag(config, "tie_word_embeddings", fam.tied_default)
    parallel = _flag(config, fam.parallel_residual_key, fam.parallel_residual_default) \
        if fam.parallel_residual_key else fam.parallel_residual_default
    facts = ModelFacts(family_name, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab,
                       tied, parallel, model_type=original_type or model_type, origin=origin)
    # kv_heads is only bounded: steerc uses it in `model { ... }` assertions alone, and transformers
    # builds models whose default does not divide the heads.
    names = {"hidden": (fam.hidden or ("hidden",))[0], "heads": (fam.heads or ("heads",))[0]}
    return _consistent(facts, names, derived_head_dim=explicit_hd is None)


def load_facts(path: str) -> ModelFacts:
    """Facts from a model folder, a ``config.json``, a facts JSON or a model name (``smollm2``)."""

    path = named_config(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        if os.path.isdir(path):
            raise FactsError("no config.json in that folder")
        raise FactsError(not_found(path))
    try:
        text, data = read_json_file(file)
    except OSError as exc:
        raise FactsError(f"cannot read {file} ({exc.strerror or exc})") from None
    except JSONError as exc:
        raise FactsError(f"cannot read {file} as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise FactsError("not a JSON object")
    try:
        if data.get("format") == FORMAT:
            return _from_facts_json(data, file)
        return facts_from_config(data, origin=file)
    except FactsError as exc:
        exc.file, exc.text = file, text
        raise


def _from_facts_json(data: dict, file: str) -> ModelFacts:
    facts = data.get("facts")
    if not isinstance(facts, dict) or any(k not in facts for k in FACT_FIELDS):
        raise FactsError(f"a steerc facts file needs all of: {', '.join(FACT_FIELDS)}", code=INVALID, file=file,
                         needle='"facts"')
    family = facts["family"]
    if not isinstance(family, str):
        raise FactsError(f"fact `family` must be a string, got {_shown(family)}", code=INVALID, file=file,
                         needle='"family"')
    if family not in FAMILIES:
        raise FactsError(f"unknown model family `{family}`", code=UNKNOWN_FAMILY,
                         file=file, needle=json.dumps(family, ensure_ascii=False))
    for key in FACT_FIELDS:
        value = facts[key]
        if key in ("tied_embeddings", "parallel_residual"):
            if not isinstance(value, bool):
                raise FactsError(f"fact `{key}` must be true or false, got {_shown(value)}", code=INVALID,
                                 file=file, needle=f'"{key}"')
        elif key != "family":
            try:
                _bounded(key, value, f"fact `{key}`", key)
            except FactsError as exc:
                exc.file = file
                raise
    out = ModelFacts(**{k: facts[k] for k in FACT_FIELDS}, origin=file)
    fam = FAMILIES[family]
    try:
        _consistent(out, {"hidden": "hidden", "heads": "heads"}, derived_head_dim=not fam.head_dim_from_config)
    except FactsError as exc:
        exc.file = file
        raise
    if facts.get("fingerprint") not in (None, out.fingerprint):
        raise FactsError("its fingerprint does not match its facts (edited by hand?)", code=INVALID, file=file,
                         needle='"fingerprint"')
    return out


def facts_document(facts: ModelFacts, backend: str) -> dict:
    """The JSON ``steerc facts`` prints: facts, then the site table for ``backend``."""

    table = site_table(facts.family, backend)
    return {
        "format": FORMAT,
        "facts": facts.to_json(),
        "backend": backend,
        "sites": table.to_json(),
    }


__all__ = ["FactsError", "ModelFacts", "facts_document", "facts_from_config", "load_facts", "FAMILIES"]
