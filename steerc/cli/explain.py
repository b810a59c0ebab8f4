"""``steerc explain FILE --model PATH [--target T] [--format text|json|html]``
``[--tokens TEXT [--raw | --chat] [--generated K]]`` (spec/explain.md for ``--tokens``).
"""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.common import (
    add_program_options,
    checked_project,
    chosen,
    facts_from,
    options_from,
    read_text,
    required,
)
from steerc.cli.report import print_json

GENERATED_DEFAULT = 8
EXPLAINED = ("hf", "vllm", "serve", "weights")  # llama.cpp's control vector has no hooks to show


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file")
    add_program_options(cmd, model_required=True)
    cmd.add_argument("--target", choices=EXPLAINED,
                     help="whose hooks to show, or for weights which matrix each site folds into (default: "
                          "`target` in steer.toml, else hf)")
    cmd.add_argument("--format", choices=("text", "json", "html"), default="text",
                     help="text for reading (default), json for tools (spec/json.md), html: a page of the "
                          "--tokens prompt, its tokens coloured by the interventions that steer them")
    cmd.add_argument("--tokens", metavar="TEXT",
                     help="show which positions of this prompt each intervention steers (tokenized with the "
                          "model's tokenizer, as `steerc run --prompt TEXT` is)")
    how = cmd.add_mutually_exclusive_group()
    how.add_argument("--chat", action="store_true",
                     help="with --tokens: the prompt in the model's chat template (the default, as `steerc run`)")
    how.add_argument("--raw", action="store_true",
                     help="with --tokens: the prompt as raw text, without the chat template (as `steerc run --raw`)")
    cmd.add_argument("--generated", type=int, metavar="K",
                     help=f"with --tokens: how many generated positions to show (default {GENERATED_DEFAULT})")


def run(args) -> int:
    from steerc.api import check_source
    from steerc.explain.plan import explain, render
    from steerc.targets import check_target

    _check_token_options(args)
    project = checked_project(args, args.file)
    model = required(args, project, "model")
    facts = facts_from(args, project)
    target = chosen(args, project, "target", "hf")
    if target not in EXPLAINED:
        raise UsageError(f"explain shows the hooks of {', '.join(EXPLAINED)}; steer.toml's target is {target} "
                         "(`steerc check --target llamacpp` says what a control vector can express): pass --target")
    result = check_source(read_text(args.file), args.file, path=os.path.abspath(args.file),
                          options=options_from(args, project), facts=facts)
    check_target(result, target)
    if not result.ok:
        print(result.render(), file=sys.stderr)
        return EXIT_ERRORS
    if result.diagnostics:
        print(result.render(), file=sys.stderr)
    doc = explain(result, target)
    if args.tokens is not None:
        doc["tokens"] = _tokens(args, result.plan, model)
    if args.format == "json":
        print_json(doc)
    elif args.format == "html":
        from steerc.explain.html import render_html

        sys.stdout.write(render_html(doc))
    elif args.tokens is not None:
        from steerc.explain.plan import title
        from steerc.explain.tokens import render_tokens

        sys.stdout.write(render_tokens(doc, title(doc)))
    else:
        sys.stdout.write(render(doc))
    return EXIT_OK


def _check_token_options(args) -> None:
    """Usage errors for the --tokens options, before anything is loaded."""
    from steerc.core.limits import MAX_GENERATED_SHOWN, MAX_PROMPT_CHARS

    if args.tokens is None:
        used = [flag for flag, on in (("--chat", args.chat), ("--raw", args.raw),
                                      ("--generated", args.generated is not None),
                                      ("--format html", args.format == "html")) if on]
        if used:
            raise UsageError(f"{used[0]} shows the tokens of a prompt: add --tokens TEXT")
        return
    if not args.tokens:
        raise UsageError("--tokens needs a prompt text (it is empty)")
    if len(args.tokens) > MAX_PROMPT_CHARS:
        raise UsageError(f"--tokens: the prompt has {len(args.tokens):,} characters, more than the "
                         f"{MAX_PROMPT_CHARS:,} explain shows (MAX_PROMPT_CHARS, spec/limits.md)")
    if args.generated is None:
        args.generated = GENERATED_DEFAULT
    if not 0 <= args.generated <= MAX_GENERATED_SHOWN:
        raise UsageError(f"--generated takes a count from 0 to {MAX_GENERATED_SHOWN:,} (MAX_GENERATED_SHOWN), "
                         f"got {args.generated}")


def _tokens(args, plan, model: str) -> dict:
    from steerc.core.limits import MAX_PROMPT_TOKENS

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError("--tokens needs torch and transformers (the runtime's position code and the "
                         "model's tokenizer): pip install 'steerc[hf]'") from None
    from steerc.cli.progress import Progress
    from steerc.explain.tokens import prompt_ids, tokens_doc
    from steerc.runtime.models import NoTokenizer, load_tokenizer

    # Loading a GGUF's tokenizer from its metadata takes half a minute: say so, on a terminal and in a log.
    progress = Progress(3, "steps", doing="explain --tokens", done="explain --tokens:", quiet_if_quick=True)
    with progress.ticking():
        try:
            progress.stage(f"loading the tokenizer of {model}")
            try:
                tokenizer = load_tokenizer(model)
            except NoTokenizer as exc:
                raise UsageError(f"--tokens needs the model's tokenizer: {exc}") from None
            progress.step()
            progress.stage("tokenizing the prompt")
            ids, templated = prompt_ids(tokenizer, args.tokens, chat=not args.raw)
            if not ids:
                raise UsageError("--tokens: the prompt tokenizes to no tokens")
            if len(ids) > MAX_PROMPT_TOKENS:
                raise UsageError(f"--tokens: the prompt is {len(ids):,} tokens, more than the {MAX_PROMPT_TOKENS:,} "
                                 "explain shows (MAX_PROMPT_TOKENS, spec/limits.md)")
            progress.step()
            progress.stage("finding the positions each intervention steers")
            doc = tokens_doc(plan, tokenizer, args.tokens, ids, templated, args.generated)
            progress.step()
        finally:
            progress.finish()
    return doc
