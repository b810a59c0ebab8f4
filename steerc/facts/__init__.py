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

from attrs import field, frozen

from steerc.facts.families import FAMILIES, MODEL_TYPES, Family

FORMAT = "steerc.facts/1"
FACT_FIELDS = (
    "family", "layers", "hidden", "heads", "kv_heads", "head_dim",
    "intermediate", "vocab", "tied_embeddings", "parallel_residual",
)


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
        blob = json.dumps(core, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    @property
    def family_info(self) -> Family | None:
        return FAMILIES.get(self.family)

    def width(self, site_kind: str) -> int:
        return self.head_dim if site_kind == "head" else self.hidden

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in FACT_FIELDS}
        out["fingerprint"] = self.fingerprint
        return out


def _first(config: dict, keys: tuple[str, ...], default=None):
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    return default


def _text_config(config: dict) -> dict:
    # Multimodal wrappers (e.g. Gemma-3) keep the language model's facts in text_config.
    inner = config.get("text_config")
    if isinstance(inner, dict) and config.get("model_type") not in MODEL_TYPES:
        merged = dict(inner)
        merged.setdefault("model_type", inner.get("model_type") or config.get("model_type"))
        return merged
    if isinstance(inner, dict) and config.get("model_type") == "gemma3":
        return {**inner, "model_type": "gemma3_text"}
    return config


def _count(config: dict, keys: tuple[str, ...], what: str, default=None, minimum: int = 1) -> int:
    value = _first(config, keys, default)
    if value is None:
        raise FactsError(f"the config does not give {what} ({' or '.join(keys) or 'no key'})")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FactsError(f"{what} must be a whole number >= {minimum}, got {value!r} ({keys[0] if keys else ''})")
    return value


def facts_from_config(config: dict, origin: str = "config") -> ModelFacts:
    """Facts from a parsed ``config.json`` (raises FactsError)."""
    original_type = config.get("model_type")
    config = _text_config(config)
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise FactsError(f"`model_type` must be a string, got {model_type!r}")
    family_name = MODEL_TYPES.get(model_type)
    if family_name is None:
        known = ", ".join(sorted(FAMILIES))
        raise FactsError(
            f"unknown model family `{model_type}`; steerc knows the layout of: {known}",
            code="unknown-family",
            needle='"model_type"',
        )
    fam = FAMILIES[family_name]
    layers = _count(config, fam.layers, "the number of layers")
    hidden = _count(config, fam.hidden, "the hidden size")
    heads = _count(config, fam.heads, "the number of attention heads")
    kv_heads = _count(config, fam.kv_heads, "the number of key-value heads", fam.kv_heads_default or heads)
    explicit_hd = config.get("head_dim", fam.head_dim_default) if fam.head_dim_from_config else None
    head_dim = _count({"head_dim": explicit_hd}, ("head_dim",), "head_dim") if explicit_hd else hidden // heads
    intermediate = _count(config, fam.intermediate, "the intermediate size", 4 * hidden)
    vocab = _count(config, fam.vocab, "the vocabulary size", 0, minimum=0)
    tied = config.get("tie_word_embeddings")
    tied = fam.tied_default if tied is None else bool(tied)
    parallel = False
    if fam.parallel_residual_key:
        value = config.get(fam.parallel_residual_key)
        parallel = fam.parallel_residual_default if value is None else bool(value)
    return ModelFacts(family_name, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab,
                      tied, parallel, model_type=original_type or model_type, origin=origin)


def load_facts(path: str) -> ModelFacts:
    """Facts from a model folder, a ``config.json``, a facts JSON or a model name (``smollm2``)."""
    from steerc.facts.named import named_config, names

    path = named_config(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        if os.path.isdir(path):
            raise FactsError("no config.json in that folder")
        raise FactsError(f"no such file or folder, and not a model name ({names()})")
    try:
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FactsError(f"cannot read {file} as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise FactsError("not a JSON object")
    if data.get("format") == FORMAT:
        return _from_facts_json(data, file)
    try:
        return facts_from_config(data, origin=file)
    except FactsError as exc:
        exc.file, exc.text = file, text
        raise


def _from_facts_json(data: dict, file: str) -> ModelFacts:
    facts = data.get("facts")
    if not isinstance(facts, dict) or any(k not in facts for k in FACT_FIELDS):
        raise FactsError(f"a steerc facts file needs all of: {', '.join(FACT_FIELDS)}")
    if facts["family"] not in FAMILIES:
        raise FactsError(f"unknown model family `{facts['family']}`", code="unknown-family",
                         file=file, needle=f'"{facts["family"]}"')
    for key in FACT_FIELDS:
        want = str if key == "family" else bool if key in ("tied_embeddings", "parallel_residual") else int
        value = facts[key]
        if not isinstance(value, want) or (want is int and (isinstance(value, bool) or value < 0)):
            raise FactsError(f"fact `{key}` has the wrong type ({value!r})")
    out = ModelFacts(**{k: facts[k] for k in FACT_FIELDS}, origin=file)
    if facts.get("fingerprint") not in (None, out.fingerprint):
        raise FactsError("its fingerprint does not match its facts (edited by hand?)")
    return out


def facts_document(facts: ModelFacts, backend: str) -> dict:
    """The JSON ``steerc facts`` prints: facts, then the site table for ``backend``."""
    from steerc.facts.sites import site_table

    table = site_table(facts.family, backend)
    return {
        "format": FORMAT,
        "facts": facts.to_json(),
        "backend": backend,
        "sites": table.to_json(),
    }


__all__ = ["FactsError", "ModelFacts", "facts_document", "facts_from_config", "load_facts", "FAMILIES"]
