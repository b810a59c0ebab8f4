"""``steerc run FILE --model PATH --prompt TEXT [--prompt TEXT ...] [--compare] [--show-gates]``
``[--max-new-tokens N] [--temperature T [--top-p P] [--seed N]] [--format text|json]`` (spec/explain.md §2;
spec/json.md for JSON).

Every argument is checked before the model loads: the flags' ranges, each prompt's characters, and,
where the model's config and tokenizer load without its weights, each prompt's tokens with the new ones
against the model's context (``MAX_PROMPT_CHARS``, ``MAX_NEW_TOKENS``, ``MAX_TEXT_TOKENS``, spec/limits.md).
The params the program runs with, and where each value came from, are one line on standard error.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.common import (
    add_program_options,
    argument_source,
    argument_spans,
    checked_project,
    config_facts,
    fail_with,
    options_from,
    read_text,
    required,
)
from steerc.cli.report import print_json
from steerc.core.limits import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, MAX_SEED, MAX_TEMPERATURE, MAX_TEXT_TOKENS

DEFAULT_NEW_TOKENS = 40


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file")
    add_program_options(cmd, model_help="a model name (smollm2: the bundled SmolLM2-135M-Instruct), a .gguf file, "
                                        "or a Hugging Face model folder with weights and tokenizer",
                        model_required=True)
    cmd.add_argument("--prompt", required=True, action="append", metavar="TEXT",
                     help="the prompt text (repeatable: each prompt is steered on its own, in order)")
    cmd.add_argument("--compare", action="store_true", help="also print the unsteered completion")
    cmd.add_argument("--max-new-tokens", type=int, default=DEFAULT_NEW_TOKENS, metavar="N",
                     help=f"how many tokens to generate (default {DEFAULT_NEW_TOKENS}; at most {MAX_NEW_TOKENS:,}, "
                          "and the prompt with them within the model's context)")
    cmd.add_argument("--temperature", type=float, default=0.0, metavar="T",
                     help="sample each token at temperature T (default 0: greedy, the most likely token each step)")
    cmd.add_argument("--top-p", type=float, metavar="P",
                     help="with --temperature: sample among the fewest tokens whose probabilities add up to P "
                          "(0 < P <= 1; default 1, every token)")
    cmd.add_argument("--seed", type=int, metavar="N",
                     help="with --temperature: the sampling seed (default 0); each completion is drawn with the "
                          "generator seeded anew, so a seed repeats its texts, and --compare's two texts draw "
                          "the same numbers")
    cmd.add_argument("--raw", action="store_true", help="do not wrap the prompt in the model's chat template")
    cmd.add_argument("--show-gates", action="store_true",
                     help="after each steered completion, whether each gate opened and the probe values that "
                          "decided it, as the runtime computed them")
    cmd.add_argument("--format", choices=("text", "json"), default="text",
                     help="text for reading (default), json for tools: the completions, and the gates with "
                          "--show-gates, as one document (spec/json.md)")


def run(args) -> int:
    refused = _refuse(args, _flag_problems(args))
    if refused is not None:
        return refused
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
        from steerc.facts.named import not_found

        raise UsageError(f"--model {model_path}: {not_found(model_path)}")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError("`steerc run` needs torch and transformers: pip install 'steerc[hf]'") from None
    from steerc.runtime.capture import config_context

    context = config_context(model_path)
    early_tokenizer = _tokenizer_without_weights(model_path)
    if early_tokenizer is not None or context is not None:
        refused = _refuse(args, _length_problems(args, _encoded(args, early_tokenizer), context))
        if refused is not None:
            return refused
    from steerc.core.limits import context_of
    from steerc.runtime.hf import facts_from_model, install
    from steerc.runtime.models import load_model
    try:
        model, tokenizer = load_model(model_path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load {model_path}: {exc}") from None
    result = check_source(text, args.file, path=path, options=options, facts=facts_from_model(model))
    if result.diagnostics:
        print(result.render(), file=sys.stderr)
    if not result.ok:
        return EXIT_ERRORS
    encoded = _encoded(args, tokenizer)
    refused = _refuse(args, _length_problems(args, encoded, context_of(model.config) or context))
    if refused is not None:
        return refused
    params = params_used(result.checked.params, options, project)
    if params:
        print("params: " + ", ".join(f"{name}={value:g} ({origin})" for name, (value, origin) in params.items()),
              file=sys.stderr)
    from steerc.explain.tokens import visible

    as_json = args.format == "json"
    records = []
    for n, (prompt, inputs) in enumerate(zip(args.prompt, encoded), 1):
        if len(args.prompt) > 1 and not as_json:
            print(f"=== prompt {n}: {visible(prompt, 60)} ===")
        length = int(inputs["input_ids"].shape[1])
        record = {"prompt": prompt, "prompt_tokens": length}
        if args.compare:
            record["unsteered"] = _complete(model, tokenizer, inputs, args)
            if not as_json:
                print(f"--- unsteered ---\n{record['unsteered']}\n--- steered ---")
        with install(model, result.plan, tokenizer) as handle:
            from steerc.runtime.hf.gates import GateTrace
            from steerc.runtime.trace import gates_json

            traced = args.show_gates or (args.compare and not as_json)
            with GateTrace(model, handle, result.plan) if traced else contextlib.nullcontext() as trace:
                record["steered"] = _complete(model, tokenizer, inputs, args)
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
                    "max_new_tokens": args.max_new_tokens, "chat": not args.raw, "sampling": _sampling(args),
                    "params": {name: {"value": value, "from": origin} for name, (value, origin) in params.items()},
                    "prompts": records})
    return EXIT_OK


# ------------------------------------------------------------------ arguments


def _flag_problems(args) -> list[tuple]:
    """(flag, which of its values, message, help) for each flag out of its range: what needs no model."""
    out = []
    n = args.max_new_tokens
    if not 1 <= n <= MAX_NEW_TOKENS:
        out.append(_problem("--max-new-tokens", f"--max-new-tokens {n}: give a count from 1 to {MAX_NEW_TOKENS:,} "
                            "(MAX_NEW_TOKENS, spec/limits.md)"))
    t = args.temperature
    if not (math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE):
        out.append(_problem("--temperature", f"--temperature {t:g}: give a temperature from 0 (greedy) to "
                            f"{MAX_TEMPERATURE:g} (MAX_TEMPERATURE)", help="0.7 samples varied, sensible text"))
    p = args.top_p
    if p is not None and not (math.isfinite(p) and 0 < p <= 1):
        out.append(_problem("--top-p", f"--top-p {p:g}: give a probability above 0, at most 1",
                            help="0.9 samples among the tokens that make up 90% of the probability"))
    seed = args.seed
    if seed is not None and not 0 <= seed <= MAX_SEED:
        out.append(_problem("--seed", f"--seed {seed}: give a seed from 0 to {MAX_SEED:,} (MAX_SEED)"))
    if t == 0:
        for flag, value in (("--top-p", p), ("--seed", seed)):
            if value is not None:
                out.append(_problem(flag, f"{flag} shapes sampling, and without --temperature run decodes greedily "
                                    "(the most likely token each step)", help="add --temperature T, for example 0.7"))
    for i, prompt in enumerate(args.prompt):
        if len(prompt) > MAX_PROMPT_CHARS:
            out.append(_problem("--prompt", f"this prompt has {len(prompt):,} characters, more than the "
                                f"{MAX_PROMPT_CHARS:,} run reads (MAX_PROMPT_CHARS, spec/limits.md)", i))
    return out


def _length_problems(args, encoded, context: int | None) -> list[tuple]:
    """The prompts' tokens (``encoded``: each prompt's inputs, or None where no tokenizer loaded yet) with
    --max-new-tokens against the model's ``context`` (None: not known) and MAX_TEXT_TOKENS."""
    from steerc.core.limits import text_tokens_limit

    limit = text_tokens_limit(context)
    bound = f"the model's context of {context:,} tokens" if limit == context else \
        f"the {MAX_TEXT_TOKENS:,} tokens (MAX_TEXT_TOKENS) steerc runs in one sequence"
    new = args.max_new_tokens
    if new >= limit:
        return [_problem("--max-new-tokens", f"--max-new-tokens {new:,} leaves no room for a prompt within {bound}",
                         help=f"give at most {limit - 1:,}")]
    out = []
    for i, inputs in enumerate(encoded or []):
        length = int(inputs["input_ids"].shape[1])
        if length == 0:
            out.append(_problem("--prompt", "this prompt tokenizes to no tokens: there is nothing to continue", i,
                                help="give some text (or drop --raw: the chat template adds its own tokens)"))
        elif length + new > limit:
            out.append(_problem("--prompt", f"this prompt is {length:,} tokens, and with --max-new-tokens {new:,} "
                                f"the sequence would be {length + new:,}, over {bound}", i,
                                help="shorten the prompt, or lower --max-new-tokens"))
    return out


def _problem(flag: str, message: str, index: int = 0, help: str | None = None) -> tuple:
    """A problem with the ``index``-th value of ``flag``, for :func:`_refuse`."""
    return flag, index, message, help


def _refuse(args, problems) -> int | None:
    """Print ``problems`` as ``invalid-value`` diagnostics at their flags' values; the exit code, or None
    when there are none."""
    if not problems:
        return None
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.codes import INVALID_VALUE

    diagnostics, sources = [], {}
    for flag, index, message, help in problems:
        src, spans = argument_spans(args, flag)
        span = spans[index] if index < len(spans) else src.span(0, len(src.text))
        sources[src.name] = src
        diagnostics.append(Diagnostic.error(INVALID_VALUE, message, span, help=help))
    return fail_with(args, diagnostics, sources)


def _tokenizer_without_weights(model_path: str):
    """The model's tokenizer where it loads on its own, quickly (a folder, a name or ``.gguf`` already
    converted), to count the prompts' tokens before the weights load; None otherwise (the load says why)."""
    from steerc.runtime.models import NoTokenizer, cache_complete, gguf_cache_folder, load_tokenizer, runnable_path

    path = runnable_path(model_path)
    if path.endswith(".gguf") and not cache_complete(gguf_cache_folder(path)):
        return None  # its tokenizer is read from the GGUF's metadata: as slow as the load that follows
    try:
        return load_tokenizer(path)
    except (NoTokenizer, OSError, ValueError):
        return None


def _encoded(args, tokenizer):
    """Each prompt's model inputs, as run feeds them (None without a tokenizer)."""
    if tokenizer is None:
        return None
    from steerc.runtime.models import encode_prompt

    return [encode_prompt(tokenizer, prompt, chat=not args.raw) for prompt in args.prompt]


def params_used(values: dict, options, project) -> dict:
    """``{name: (value, where it came from)}`` for each param of the checked program, in declaration order:
    ``--set``, the project's ``steer.toml`` (named as diagnostics name it), or ``default`` (the program's)."""
    from steerc.project import display_name

    toml = display_name(project.file) if project is not None and project.file else "steer.toml"
    out = {}
    for name, value in values.items():
        origin = "--set" if name in options.overrides else toml if name in options.project_params else "default"
        out[name] = (value, origin)
    return out


def _sampling(args) -> dict | None:
    """The sampling a completion is drawn with (None: greedy)."""
    if args.temperature == 0:
        return None
    return {"temperature": args.temperature, "top_p": 1.0 if args.top_p is None else args.top_p,
            "seed": 0 if args.seed is None else args.seed}


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


def _complete(model, tokenizer, inputs, args) -> str:
    """One completion: greedy, or sampled as --temperature, --top-p and --seed say (the generator seeded anew
    for each completion, and only the top-p cut applied, whatever the model's generation config sets)."""
    import torch

    sampling = _sampling(args)
    options = {"do_sample": False}
    if sampling is not None:
        torch.manual_seed(sampling["seed"])
        options = {"do_sample": True, "temperature": sampling["temperature"], "top_p": sampling["top_p"],
                   "top_k": 0}
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                             **options)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
