"""Steer's built-in functions, one table: what each is called, takes and does.

Every user reads this table rather than keeping its own list: the checker
(``names`` reports any other called name, ``types`` checks arity and keyword
arguments from it), the highlighters (:mod:`steerc.highlight.words`), and the
language server's completion and hover. The meaning of each function stays
with the pass that gives it (``types``, ``fold``, ``foldvec``, ``loading``);
those passes find a function's role here (:func:`reads_vectors`,
:func:`is_schedule`) instead of comparing names.

A ``source`` function reads vectors from a file; the kinds of file it reads
are the table of readers in :mod:`steerc.io.vectors` (``READERS``). ``sae``
reads a SAELens SAE folder (:mod:`steerc.io.sae`), in a ``sae`` declaration.

>>> FUNCTIONS
('load', 'normalize', 'ramp', 'decay', 'window', 'sae')
>>> BUILTINS["window"].signature, BUILTINS["load"].keyword_names
('window(a, b)', ('key', 'per_layer'))
>>> reads_vectors("load"), is_schedule("load"), is_schedule("ramp")
(True, False, True)
"""

from __future__ import annotations

from steerc.core.record import frozen

SOURCE, VECTOR_FN, SCHEDULE_FN, SAE_FN = "source", "vector", "schedule", "sae"


@frozen
class Builtin:
    name: str
    kind: str  # SOURCE (reads vectors from a file), VECTOR_FN (a vector to a vector), SCHEDULE_FN (numbers to a
    # schedule), SAE_FN (an SAE folder, for a `sae` declaration)
    params: tuple[str, ...]  # the positional parameters, in order
    keywords: tuple[tuple[str, str], ...]  # (name, type) of each keyword argument; types as passes.types names them
    doc: str  # one line, for hover, completion and the checker's help

    @property
    def signature(self) -> str:
        kws = [f"{k}=..." for k, _ in self.keywords]
        return f"{self.name}({', '.join(list(self.params) + kws)})"

    @property
    def keyword_names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.keywords)


BUILTINS: dict[str, Builtin] = {b.name: b for b in (
    Builtin("load", SOURCE, ("path",), (("key", "string"), ("per_layer", "bool")),
            "a vector (or with per_layer=true one per layer) read from a vector file"),
    Builtin("normalize", VECTOR_FN, ("v",), (), "the vector scaled to length 1"),
    Builtin("ramp", SCHEDULE_FN, ("n",), (), "from 1/n up to 1 over the first n steps"),
    Builtin("decay", SCHEDULE_FN, ("r",), (), "r to the power of the step, 0 < r <= 1"),
    Builtin("window", SCHEDULE_FN, ("a", "b"), (), "1 for steps a to b-1, 0 elsewhere"),
    Builtin("sae", SAE_FN, ("folder",), (),
            "a SAELens SAE folder (cfg.json and sae_weights.safetensors), in `sae NAME = sae(...)`"),
)}
FUNCTIONS: tuple[str, ...] = tuple(BUILTINS)


def kind_of(func: str) -> str | None:
    """The kind of the built-in ``func``, or None for a name that is no built-in."""
    b = BUILTINS.get(func)
    return b.kind if b is not None else None


def reads_vectors(func: str) -> bool:
    """Whether calling ``func`` reads vectors from a file (``load``)."""
    return kind_of(func) == SOURCE


def is_schedule(func: str) -> bool:
    """Whether ``func`` makes a schedule (a factor that varies with the generation step)."""
    return kind_of(func) == SCHEDULE_FN


__all__ = ["BUILTINS", "FUNCTIONS", "SAE_FN", "SCHEDULE_FN", "SOURCE", "VECTOR_FN", "Builtin", "is_schedule", "kind_of",
           "reads_vectors"]
