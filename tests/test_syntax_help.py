"""Syntax errors in the middle of a block line say what the line's keyword needs."""

from __future__ import annotations

import pytest

from steerc.core.source import Source
from steerc.diagnostics import Diagnostics
from steerc.frontend import parse

PROGRAM = """steer 1
vector joy = [1.0, 0.0]
vector harm = [0.0, 1.0]
intervention x {{
  at resid_post[1]
  {line}
}}
"""


def error_for(line: str):
    diagnostics = Diagnostics()
    parse(Source("t.steer", PROGRAM.format(line=line)), diagnostics)
    errors = diagnostics.errors
    assert len(errors) == 1, [d.message for d in errors]
    return errors[0]


@pytest.mark.parametrize(
    "line, message, help_line",
    [
        ("clamp joy 3.0", "unexpected number `3.0`; `clamp` needs `to` before the value",
         "write `clamp joy to 3.0`"),
        ("add 4 joy", "unexpected `joy`; `add` takes one expression", "to multiply, write `add 4 * joy`"),
        ("scale 2 joy", "`scale` takes one expression", "`scale 2 * joy`"),
        ("set joy harm", "`set` takes one expression", "`set joy + harm`"),
        ("ablate joy harm", "unexpected `harm`; `ablate` separates its directions with commas",
         "write `ablate joy, harm`"),
        ("at resid_post[1], resid_post[3]", "unexpected `,`; `at` takes one site", "`resid_post[1, 3]`"),
        ("at resid_post[1] attn_out[1]", "`at` takes one site", "needs an intervention of its own"),
        ("tokens prompt generated", "`tokens` separates its scopes with commas", "write `tokens prompt, generated`"),
        ("rotate in (joy, harm) 30deg", "continues with `to` (the angle to set) or `by`",
         "`rotate in (joy, harm) by 30deg`"),
        ("suppress joy", "`suppress` takes no operand", "ablate"),
        ("add joy when p > 0", "expected a new line (`when` starts a line of its own)", "on the next line"),
        ("clamp joy to 3 4", "`clamp` takes one expression after `to`", "`clamp joy to 3 * 4`"),
        ("preserve norm norm", "`preserve norm` takes nothing more", "alone"),
    ],
)
def test_the_help_says_what_the_line_needs(line, message, help_line):
    d = error_for(line)
    assert d.code == "syntax-error"
    assert message in d.message, d.message
    assert d.help is not None and help_line in d.help, d.help
    assert "each line of a block goes on its own line" not in d.message
    if "when" not in line:
        assert "own line" not in d.help, d.help


def test_the_caret_is_on_the_unexpected_token():
    d = error_for("clamp joy 3.0")
    assert (d.span.line, d.span.column, d.span.end_column) == (6, 13, 16)


def test_a_line_continued_inside_brackets_is_quoted_whole():
    d = error_for("add [1.0,\n    0.0] joy")
    assert "`add [1.0, 0.0] + joy`" in d.help


@pytest.mark.parametrize("text", [
    "steer 1\nparam x = 1 +\n",
    "steer 1\nintervention x {\n  at resid_post[1]\n  clamp joy to\n}\n",
    "steer 1\nintervention x {\n  at resid_post[1]\n  add 4 joy\n}\n",
    "",
])
def test_no_message_says_unexpected_the(text):
    diagnostics = Diagnostics()
    parse(Source("t.steer", text), diagnostics)
    (d,) = diagnostics.errors
    assert "unexpected the" not in d.message, d.message


def test_end_of_line_is_a_span_on_that_line():
    diagnostics = Diagnostics()
    parse(Source("t.steer", "steer 1\nparam x = 1 +\n"), diagnostics)
    (d,) = diagnostics.errors
    assert d.message.startswith("unexpected end of line")
    assert (d.span.line, d.span.end_line) == (2, 2)


@pytest.mark.parametrize("text", [
    "param strength = 4\n",
    "# my program\n\nparam strength = 4\n",
    "\n\n// notes\nvector v = [1.0]\n",
    "intervention x {\n  at resid_post[1]\n  scale 0.5\n}\n",
])
def test_a_program_without_its_header_is_told_to_start_with_it(text):
    """Issue 32: a program without `steer 1` got "unexpected `param`" with no help line once a comment or a blank
    line came first."""
    diagnostics = Diagnostics()
    parse(Source("t.steer", text), diagnostics)
    [error] = diagnostics.errors
    assert "expected `steer`" in error.message
    assert error.help and "steer 1" in error.help
