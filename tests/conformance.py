"""The conformance suite: every shared example behaves as the brief says.

* ``*.steer`` check clean (exit 0, no errors) with no ``--model``, with
  ``models/tiny-llama``, and, when they have no ``model { ... }`` block, with
  every other tiny model; the programs that load no vectors also check
  clean against every config in ``models/real/``.
* ``bad/*.steer`` exit 1 with an error of each expected code on each
  expected line (``# expect: error[CODE] line N``), checked with
  ``--model`` when the file names one (``# model: models/NAME``).

Runs the real command line (``steerc check --format json``) in-process.
Usable from pytest (``tests/test_conformance.py``) and on its own::

    python tests/conformance.py ../shared/examples
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import sys

EXPECT = re.compile(r"^#\s*expect:\s*(error|warning)\[([a-z-]+)\]\s+line\s+(\d+)\s*$", re.M)
MODEL = re.compile(r"^#\s*model:\s*(\S+)\s*$", re.M)


def default_examples() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("STEERC_EXAMPLES", os.path.join(here, "..", "..", "shared", "examples"))


def run_check(args: list[str]) -> tuple[int, dict]:
    from steerc.cli import main

    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["check", "--format", "json", *args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    text = out.getvalue()
    return code, (json.loads(text) if text.strip() else {"diagnostics": [], "stderr": err.getvalue()})


def _has_model_block(path: str) -> bool:
    with open(path, encoding="utf-8") as fh:
        return re.search(r"^\s*model\s*\{", fh.read(), re.M) is not None


def _loads_vectors(path: str) -> bool:
    with open(path, encoding="utf-8") as fh:
        return re.search(r"^\s*vector\s", fh.read(), re.M) is not None


def good_cases(examples: str) -> list[tuple[str, str | None]]:
    """(program, model folder or None) pairs that must check clean."""
    cases = []
    tiny = sorted(glob.glob(os.path.join(examples, "models", "tiny-*")))
    real = sorted(glob.glob(os.path.join(examples, "models", "real", "*")))
    for prog in sorted(glob.glob(os.path.join(examples, "*.steer"))):
        cases.append((prog, None))
        cases.append((prog, os.path.join(examples, "models", "tiny-llama")))
        if not _has_model_block(prog):
            cases.extend((prog, m) for m in tiny if not m.endswith("tiny-llama"))
            if not _loads_vectors(prog):
                cases.extend((prog, m) for m in real)
    return cases


def bad_cases(examples: str) -> list[tuple[str, str | None, list[tuple[str, str, int]]]]:
    cases = []
    for prog in sorted(glob.glob(os.path.join(examples, "bad", "*.steer"))):
        with open(prog, encoding="utf-8") as fh:
            text = fh.read()
        expects = [(sev, code, int(line)) for sev, code, line in EXPECT.findall(text)]
        model = MODEL.search(text)
        model_dir = os.path.join(examples, model.group(1)) if model else None
        cases.append((prog, model_dir, expects))
    return cases


def check_good(prog: str, model: str | None) -> str | None:
    """None when the case passes, else what went wrong."""
    args = [prog] + (["--model", model] if model else [])
    code, out = run_check(args)
    errors = [d for d in out["diagnostics"] if d["severity"] == "error"]
    if code != 0 or errors:
        shown = "; ".join(f"{d['code']} line {d['line']}: {d['message']}" for d in errors)
        return f"exit {code}: {shown or out.get('stderr', '')}"
    return None


def check_bad(prog: str, model: str | None, expects) -> str | None:
    if not expects:
        return "no `# expect:` line"
    args = [prog] + (["--model", model] if model else [])
    code, out = run_check(args)
    if code != 1:
        return f"exit {code}, expected 1"
    found = {(d["severity"], d["code"], d["line"]) for d in out["diagnostics"]}
    missing = [f"{sev}[{c}] line {n}" for sev, c, n in expects if (sev, c, n) not in found]
    if missing:
        got = ", ".join(f"{s}[{c}] line {n}" for s, c, n in sorted(found, key=str))
        return f"missing {', '.join(missing)}; got {got or 'nothing'}"
    return None


def main(argv: list[str]) -> int:
    examples = os.path.abspath(argv[0] if argv else default_examples())
    failures = 0
    total = 0
    for prog, model in good_cases(examples):
        total += 1
        problem = check_good(prog, model)
        label = f"{os.path.relpath(prog, examples)} --model {os.path.relpath(model, examples)}" if model else os.path.relpath(prog, examples)
        print(f"{'ok  ' if problem is None else 'FAIL'} good  {label}" + (f": {problem}" if problem else ""))
        failures += problem is not None
    for prog, model, expects in bad_cases(examples):
        total += 1
        problem = check_bad(prog, model, expects)
        label = os.path.relpath(prog, examples)
        want = ", ".join(f"{s}[{c}] line {n}" for s, c, n in expects)
        print(f"{'ok  ' if problem is None else 'FAIL'} bad   {label} ({want})" + (f": {problem}" if problem else ""))
        failures += problem is not None
    print(f"\nconformance: {total - failures}/{total} cases pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
