"""``steerc run FILE --model PATH --prompt TEXT [--prompt TEXT ...] [--compare] [--show-gates]``
``[--max-new-tokens N] [--format text|json]`` (spec/explain.md for ``--show-gates``, spec/json.md for JSON).
"""

from __future__ import annotations

import contextlib
import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.common import (
    config_facts,
    add_program_options,
    argument_source,
    checked_project,
    options_from,
    read_text,
    required,
)
from steerc.cli.report import print_json


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file")
    add_program_options(cmd, model_help="a model name (smollm2: the bundled SmolLM2-135M-Instruct), a .gguf file, "
                                        "or a Hugging Face model folder with weights and tokenizer",
                        model_required=True)
    cmd.add_argument("--prompt", required=True, action="append", metavar="TEXT",
                     help="the prompt text (repeatable: each prompt is steered on its own, in order)")
    cmd.add_argument("--compare", action="store_true", help="also print the unsteered completion")
    cmd.add_argument("--max-new-tokens", type=int, default=40, metavar="N",
                     help="how many tokens to generate (default 40; greedy)")
    cmd.add_argument("--raw", action="store_true", help="do not wrap the prompt in the model's chat template")
    cmd.add_argument("--show-gates", action="store_true",
                     help="after each steered completion, whether each gate opened and the probe values that "
                          "decided it, as the runtime computed them")
    cmd.add_argument("--format", choices=("text", "json"), default="text",
                     help="text for reading (default), json for tools: the completions, and the gates with "
                          "--show-gates, as one document (spec/json.md)")


def run(args) -> int:
    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    from steerc.api import check_source

    text = read_text(args.file)
    project = checked_project(args, args.file)
    model_path = required(args, project, "model")
    options = options_from(args, project)
    path = os.path.abspath(args.file)
    # The program is checked before the model loads, against the layout its config gives where it has
    # one: a mistake costs no load.
    early = check_source(text, args.file, path=path, options=options, facts=config_facts(model_path))
    if not early.ok:
        print(early.render(), file=sys.stderr)
        return EXIT_ERRORS
    from steerc.runtime.models import ModelNotRunnable, runnable_path

    try:
        runnable_path(model_path)
    except ModelNotRunnable as problem:
        return _report(args, problem, project)
    if not os.path.exists(runnable_path(model_path)):
        from steerc.facts.named import names

        raise UsageError(f"--model {model_path}: no such folder or file, and not a model name ({names()})")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError("`steerc run` needs torch and transformers: pip install 'steerc[hf]'") from None
    from steerc.runtime.hf import facts_from_model, install
    from steerc.runtime.models import encode_prompt, load_model
    try:
        model, tokenizer = load_model(model_path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load {model_path}: {exc}") from None
    result = check_source(text, args.file, path=path, options=options, facts=facts_from_model(model))
    if result.diagnostics:
        print(result.render(), file=sys.stderr)
    if not result.ok:
        return EXIT_ERRORS
    from steerc.explain.tokens import visible

    as_json = args.format == "json"
    records = []
    for n, prompt in enumerate(args.prompt, 1):
        if len(args.prompt) > 1 and not as_json:
            print(f"=== prompt {n}: {visible(prompt, 60)} ===")
        inputs = encode_prompt(tokenizer, prompt, chat=not args.raw)
        length = int(inputs["input_ids"].shape[1])
        record = {"prompt": prompt, "prompt_tokens": length}
        if args.compare:
            record["unsteered"] = _complete(model, tokenizer, inputs, args.max_new_tokens)
            if not as_json:
                print(f"--- unsteered ---\n{record['unsteered']}\n--- steered ---")
        with install(model, result.plan, tokenizer) as handle:
            from steerc.runtime.hf.gates import GateTrace
            from steerc.runtime.trace import gates_json

            traced = args.show_gates or (args.compare and not as_json)
            with GateTrace(model, handle, result.plan) if traced else contextlib.nullcontext() as trace:
                record["steered"] = _complete(model, tokenizer, inputs, args.max_new_tokens)
        if not as_json:
            print(record["steered"])
            if args.compare and not args.show_gates:
                for line in closed_gates(trace.report()[0], same=record["steered"] == record["unsteered"]):
                    print(line)
        if args.show_gates:
            row = trace.report()[0]
            if as_json:
                record["gates"] = gates_json(row)
            else:
                sys.stdout.write("--- gates ---\n" + render_gates(row, length))
        records.append(record)
    if as_json:
        print_json({"format": "steerc.run/1", "file": args.file, "model": model_path,
                    "max_new_tokens": args.max_new_tokens, "chat": not args.raw, "prompts": records})
    return EXIT_OK


def closed_gates(row: dict, same: bool) -> list[str]:
    """For ``--compare``: a note for each gate that stayed closed (held nowhere), with the probe values that
    kept it shut and what would open it; ``same``: the two texts are equal, which the note then explains."""
    from steerc.explain.plan import gate_text, precise

    lines = []
    for g in row["gates"]:
        if g["decided"] == "once per sequence":
            if g["opened"]:
                continue
            what = "stayed closed"
        else:
            if g["positions"]:
                continue
            what = "held at no position"
        values = []
        for c in g["comparisons"]:
            if c["pool"] != "token":
                values.append(f"{c['probe']} = {precise(c['value'])}")
            elif "min" in c:
                values.append(f"{c['probe']} from {precise(c['min'])} to {precise(c['max'])}")
        who = ", ".join(g["interventions"])
        why = f" ({'; '.join(values)})" if values else ""
        lead = "the two texts are the same: " if same else ""
        lines.append(f"note: {lead}the gate of {who} {what}{why}; it opens when {gate_text(g['gate'], precise)}, "
                     f"so {who} steered nothing (--show-gates for the details)")
    return lines


def render_gates(row: dict, length: int) -> str:
    """``--show-gates`` for one row: each gate's decision, then the comparisons and probe values behind it."""
    from steerc.explain.plan import gate_text, precise
    from steerc.explain.tokens import ranges

    if not row["gates"]:
        return "no gates: every intervention steers without a condition\n"
    lines = [f"positions 0..{length - 1} are the prompt (P = {length}); {row['positions']} positions passed"]
    for g in row["gates"]:
        when = f"{', '.join(g['interventions'])}: when {gate_text(g['gate'], precise)}"
        if g["decided"] == "once per sequence":
            lines.append(f"{when}: {'OPENED' if g['opened'] else 'stayed closed'} "
                         "(decided once per sequence, when the prompt had passed the probe's site)")
        else:
            lines.append(f"{when}: held at {len(g['positions'])} of {row['positions']} positions"
                         + (f": {ranges(g['positions'])}" if g["positions"] else "") + " (decided per position)")
        steered = "; ".join(f"{name} at {ranges(at)}" if at else f"{name} nowhere" for name, at in g["steered"].items())
        lines.append(f"  steered: {steered}")
        for c in g["comparisons"]:
            test = f"{c['probe']} {c['op']} {precise(c['threshold'])}"
            where = f"{c['readout']} at {c['site']}"
            if c["pool"] != "token":
                lines.append(f"  {c['probe']} = {precise(c['value'])} ({where}, pool {c['pool']}): "
                             f"{test} {'holds' if c['held'] else 'does not hold'}")
            elif "min" in c:
                lines.append(f"  {c['probe']} ({where}, per token): min {precise(c['min'])} at {c['min_at']}, "
                             f"max {precise(c['max'])} at {c['max_at']}; {test} at {len(c['positions'])} "
                             f"positions" + (f": {ranges(c['positions'])}" if c["positions"] else ""))
    return "\n".join(lines) + "\n"


def _report(args, problem, project) -> int:
    """A ``model-without-weights`` diagnostic pointing at the ``--model`` argument (or steer.toml's ``model``)."""
    from steerc.diagnostics import Diagnostic, Note, render_text
    from steerc.diagnostics.codes import MODEL_WITHOUT_WEIGHTS

    if args.model:
        source, span = argument_source(args, "--model")
        sources = {source.name: source}
    else:
        sources, span = project.sources, project.spans["model"]
    diagnostic = Diagnostic.error(MODEL_WITHOUT_WEIGHTS, problem.message, span, help=problem.help,
                                  notes=tuple(Note(n) for n in problem.notes))
    print(render_text(diagnostic, sources), file=sys.stderr)
    return EXIT_ERRORS


def _complete(model, tokenizer, inputs, max_new_tokens: int) -> str:
    import torch

    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
