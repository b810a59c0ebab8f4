"""``steerc run FILE --model PATH --prompt TEXT [--compare] [--max-new-tokens N]``."""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.common import add_program_options, argument_source, checked_project, options_from, read_text, required


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file")
    add_program_options(cmd, model_help="a model name (smollm2: the bundled SmolLM2-135M-Instruct), a .gguf file, "
                                        "or a Hugging Face model folder with weights and tokenizer",
                        model_required=True)
    cmd.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt text")
    cmd.add_argument("--compare", action="store_true", help="also print the unsteered completion")
    cmd.add_argument("--max-new-tokens", type=int, default=40, metavar="N",
                     help="how many tokens to generate (default 40; greedy)")
    cmd.add_argument("--raw", action="store_true", help="do not wrap the prompt in the model's chat template")


def run(args) -> int:
    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    from steerc.api import check_source

    text = read_text(args.file)
    project = checked_project(args, args.file)
    model_path = required(args, project, "model")
    options = options_from(args, project)
    path = os.path.abspath(args.file)
    # The program is checked before the model loads: a mistake costs no load.
    early = check_source(text, args.file, path=path, options=options)
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
    inputs = encode_prompt(tokenizer, args.prompt, chat=not args.raw)
    if args.compare:
        print("--- unsteered ---")
        print(_complete(model, tokenizer, inputs, args.max_new_tokens))
        print("--- steered ---")
    with install(model, result.plan, tokenizer):
        print(_complete(model, tokenizer, inputs, args.max_new_tokens))
    return EXIT_OK


def _report(args, problem, project) -> int:
    """A ``model-without-weights`` diagnostic pointing at the ``--model`` argument (or steer.toml's ``model``)."""
    from steerc.diagnostics import Diagnostic, Note, render_text

    if args.model:
        source, span = argument_source(args, "--model")
        sources = {source.name: source}
    else:
        sources, span = project.sources, project.spans["model"]
    diagnostic = Diagnostic.error("model-without-weights", problem.message, span, help=problem.help,
                                  notes=tuple(Note(n) for n in problem.notes))
    print(render_text(diagnostic, sources), file=sys.stderr)
    return EXIT_ERRORS


def _complete(model, tokenizer, inputs, max_new_tokens: int) -> str:
    import torch

    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
