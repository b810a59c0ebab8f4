"""Fuzzing what rewrites a user's file and what lm-eval hands the model (issue 32).

* ``steerc.project.edit.set_params`` (``tune``'s and ``derive --calibrate --write``'s edit of steer.toml) on
  TOML made of pieces (tables, dotted keys, comments, CRLF and LF and lone CR mixed, a BOM, inline tables):
  it refuses (``EditError``) or returns text that reads as the old document with the params set, in which
  every line that sets none of them is kept byte for byte, line end included, in order.
* ``steerc.eval.model_args.check_model_args`` on any values lm-eval could pass: the checked arguments, or
  ``ModelArgsError`` naming the argument, never another exception.
"""

from __future__ import annotations

import math

from fuzzing import RAN, fuzz
from hypothesis import given
from hypothesis import strategies as st

from steerc.core.source import normalize_newlines
from steerc.eval.model_args import ModelArgsError, check_model_args
from steerc.project.edit import EditError, set_params
from steerc.project.toml import tomllib

NAMES = ["strength", "bias", "threshold", "a-b", "x y"]
LINE_ENDS = st.sampled_from(["\n", "\r\n"])
_LINES = st.one_of(
    st.sampled_from(["[params]", "[defaults]", "[x]", "[params.sub]", "# a comment", "", "model = \"m\"",
                     "params = {strength = 1.0}", "[[arr]]", "target = 'hf'"]),
    st.builds(lambda k, v, c: f"{k} = {v}{c}", st.sampled_from(NAMES + ["params.strength", "params.bias",
                                                                          '"strength"', "other"]),
              st.sampled_from(["1", "2.5", "-3e2", "0", "inf", "nan", "\"s\"", "[1, 2]", "1_000"]),
              st.sampled_from(["", "  # tuned", " #", "\t# é"])),
)


@fuzz(400, "steer-toml-edit")
@given(st.lists(st.tuples(_LINES, LINE_ENDS), max_size=12), st.booleans(),
       st.dictionaries(st.sampled_from(NAMES), st.floats(allow_nan=True, allow_infinity=True), min_size=1,
                       max_size=3))
def test_setting_params_keeps_every_other_line(lines, final_newline, values):
    text = "".join(line + end for line, end in lines)
    if not final_newline and text:
        text = text[:-1]
    try:
        before = tomllib.loads(normalize_newlines(text))  # as every command reads steer.toml
    except tomllib.TOMLDecodeError:
        before = None
    try:
        new = set_params(text, values)
    except EditError:
        RAN["steer-toml-edit"] += 1
        return
    assert before is not None  # a file that does not parse is refused
    assert all(math.isfinite(v) for v in values.values())  # so is a value TOML cannot hold
    after = tomllib.loads(normalize_newlines(new))
    assert after == dict(before, params={**before.get("params", {}), **{k: float(v) for k, v in values.items()}})
    old_lines, new_lines = text.splitlines(keepends=True), new.splitlines(keepends=True)
    kept = [line for line in old_lines if not any(n in line for n in values)]
    last = old_lines[-1] if old_lines and not old_lines[-1].endswith(("\n", "\r")) else None

    def same(line: str, other: str) -> bool:  # a last line without an end may gain one, nothing else changes
        return other == line or (line is last and other.startswith(line) and other[len(line):] in ("\n", "\r\n", "\r"))

    it = iter(new_lines)
    assert all(any(same(line, other) for other in it) for line in kept), (text, new)  # in order, byte for byte
    RAN["steer-toml-edit"] += 1


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["auto", "auto:4", "strength=4;bias=-1", "=", ";;",
                                                           "joy.steer", "cuda:0", "cpu", "1e999"]))


@fuzz(400, "lm-eval-model-args")
@given(st.dictionaries(st.sampled_from(["program", "model", "set", "root", "max_length", "batch_size",
                                         "max_batch_size", "device", "max_lenght", "x"]), _VALUES, max_size=6))
def test_model_args_are_checked_or_refused_by_name(args):
    try:
        checked = check_model_args(dict(args))
    except ModelArgsError as exc:
        assert any(name in str(exc) for name in list(args) + ["program"]), str(exc)
    else:
        if "max_length" in checked and checked["max_length"] is not None:
            assert isinstance(checked["max_length"], int) and checked["max_length"] >= 1
    RAN["lm-eval-model-args"] += 1


def test_a_nan_score_makes_the_win_rate_nan_not_a_loss():
    """issue 32: at an overflowed strength every score is NaN, and eval's table showed a win rate of 0.000."""
    from steerc.eval.metrics import point_metrics

    m = point_metrics([(float("nan"), 1.0), (2.0, 0.5)], [], resamples=50)
    assert math.isnan(m["win_rate"]["mean"])
    assert point_metrics([(1.0, 1.0), (-2.0, 0.5), (0.0, 0.0)], [], resamples=50)["win_rate"]["mean"] == 0.5
