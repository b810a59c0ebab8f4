"""The ``model_args`` of lm-eval's ``steerc`` model type (:mod:`steerc.eval.harness`), checked before any load.

lm-eval hands a model its ``--model_args`` as keyword arguments, each value
already turned into a bool, an int or a float where it looks like one
(``max_length=-5`` arrives as ``-5.0``), beside its own ``batch_size``,
``max_batch_size`` and ``device``. A value the model would use wrongly (a
``max_length`` of -5 keeps all but the last five tokens of every context)
or a key it would ignore (``max_lenght``) is refused here, with a message
that names the argument; this module does not import lm-eval, so it is
tested without it.

>>> check_model_args({"program": "joy.steer", "max_length": 2048.0, "batch_size": "auto:4"})["max_length"]
2048
>>> try:
...     check_model_args({"program": "joy.steer", "max_length": -5.0})
... except ModelArgsError as exc:
...     print(exc)
steerc model_args: max_length=-5 is not a whole number from 1 to 16,384 (MAX_TEXT_TOKENS, spec/limits.md): the tokens of context each request keeps
"""

from __future__ import annotations

from steerc.core.limits import MAX_NEW_TOKENS, MAX_TEXT_TOKENS

NAMES = ("program", "model", "set", "root", "max_length", "batch_size")
LM_EVAL_NAMES = ("max_batch_size", "device")  # what lm-eval's simple_evaluate passes every model besides
MAX_BATCH = 1 << 20


class ModelArgsError(ValueError):
    """A ``model_args`` value (or a task's generation argument) steerc refuses; the message names it."""


def parse_sets(text) -> dict[str, float]:
    """``set=strength=4;bias=0.5`` (lm-eval's model_args split on commas, so several sets take ``;``).

    >>> parse_sets("strength=4; bias=-0.5")
    {'strength': 4.0, 'bias': -0.5}
    """
    import math

    out = {}
    for part in str(text or "").split(";"):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            raise ModelArgsError(f"steerc model_args: set={part!r} is not NAME=NUMBER") from None
        if not sep or not name.strip():
            raise ModelArgsError(f"steerc model_args: set={part!r} is not NAME=NUMBER")
        if not math.isfinite(number):
            raise ModelArgsError(f"steerc model_args: set={part!r}: the value must be finite")
        out[name.strip()] = number
    return out


def whole(value, name: str, low: int, high: int, what: str, where: str = "steerc model_args") -> int:
    """``value`` as an int from ``low`` to ``high``: an int, a float with no fraction (lm-eval's ``-5.0``), or
    a string of digits; anything else (a bool, ``2.5``, ``inf``, ``"abc"``) raises ModelArgsError naming
    ``name`` and saying ``what`` it is.

    >>> whole("12", "max_length", 1, 100, "tokens"), whole(12.0, "max_length", 1, 100, "tokens")
    (12, 12)
    """
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) <= 20:
        number = int(value.strip())
    if number is None or not low <= number <= high:
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        limit = {MAX_TEXT_TOKENS: " (MAX_TEXT_TOKENS, spec/limits.md)",
                 MAX_NEW_TOKENS: " (MAX_NEW_TOKENS, spec/limits.md)"}.get(high, "")
        raise ModelArgsError(f"{where}: {name}={shown[:40]} is not a whole number from {low:,} to {high:,}{limit}: "
                             f"{what}")
    return number


def check_model_args(args: dict) -> dict:
    """The model_args, checked and normalized (raises ModelArgsError): ``program`` given; ``max_length`` an
    int from 1 to MAX_TEXT_TOKENS or None (the model's context); ``batch_size`` a whole number of at least 1 or
    ``auto`` / ``auto:N`` (requests are scored one at a time, so it changes no number); no key steerc does
    not know."""
    from steerc.diagnostics.suggest import did_you_mean

    unknown = [k for k in args if k not in NAMES + LM_EVAL_NAMES]
    if unknown:
        hint = did_you_mean(unknown[0], list(NAMES))
        raise ModelArgsError(f"steerc model_args: unknown argument {unknown[0]!r} (it takes "
                             f"{', '.join(NAMES)})" + (f"; {hint}" if hint else ""))
    out = dict(args)
    if not out.get("program") or not isinstance(out["program"], str):
        raise ModelArgsError("steerc model_args: give program=PATH.steer")
    if out.get("max_length") is not None:
        out["max_length"] = whole(out["max_length"], "max_length", 1, MAX_TEXT_TOKENS,
                                  "the tokens of context each request keeps")
    out["batch_size"] = _batch_size(out.get("batch_size", 1))
    if out.get("max_batch_size") is not None:
        out["max_batch_size"] = whole(out["max_batch_size"], "max_batch_size", 1, MAX_BATCH,
                                      "the most requests in one batch")
    out["set"] = parse_sets(out.get("set"))
    return out


def _batch_size(value):
    if isinstance(value, str) and value.strip().lower().startswith("auto"):
        rest = value.strip()[4:]
        if rest and not (rest.startswith(":") and rest[1:].isdigit() and int(rest[1:]) >= 1):
            raise ModelArgsError(f"steerc model_args: batch_size={value} is not auto, auto:N or a whole number")
        return value.strip().lower()
    return whole(value, "batch_size", 1, MAX_BATCH, "requests per batch (steerc scores them one at a time)")


def max_length_for(max_length: int | None, context: int | None) -> int:
    """The tokens of context each request keeps: ``max_length`` (checked) within the model's ``context``
    (None: not known), else the context, never above MAX_TEXT_TOKENS.

    >>> max_length_for(None, 8192), max_length_for(512, 8192), max_length_for(None, None)
    (8192, 512, 2048)
    """
    if max_length is None:
        return min(context or 2048, MAX_TEXT_TOKENS)
    if context is not None and max_length > context:
        raise ModelArgsError(f"steerc model_args: max_length={max_length} is over the model's context of "
                             f"{context:,} tokens: the model would read positions it never learned")
    return max_length


def max_gen_toks(value, max_length: int) -> int:
    """A task's ``max_gen_toks`` (from its ``generation_kwargs``) as an int from 1 to MAX_NEW_TOKENS that leaves
    at least one token of context within ``max_length``.

    >>> max_gen_toks(256.0, 2048)
    256
    """
    high = min(MAX_NEW_TOKENS, max_length - 1)
    if high < 1:
        raise ModelArgsError(f"steerc model: max_length={max_length} leaves no room to generate")
    return whole(value, "max_gen_toks", 1, high, f"the tokens generated, within max_length {max_length:,} with "
                 "at least one token of context", where="steerc model: the task's generation_kwargs")
