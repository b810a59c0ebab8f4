"""``steerc run FILE --model PATH --prompt TEXT [--compare] [--max-new-tokens N]``."""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.common import options_from, read_text


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file")
    cmd.add_argument("--model", metavar="PATH", required=True,
                     help="a Hugging Face model folder (with weights) or a .gguf file")
    cmd.add_argument("--prompt", required=True, help="the prompt text")
    cmd.add_argument("--compare", action="store_true", help="also print the unsteered completion")
    cmd.add_argument("--max-new-tokens", type=int, default=40, metavar="N")
    cmd.add_argument("--raw", action="store_true", help="do not wrap the prompt in the model's chat template")
    cmd.add_argument("--root", metavar="DIR", help="project root for paths in the program")
    cmd.add_argument("--set", metavar="NAME=VALUE", action="append", default=[], dest="overrides")


def run(args) -> int:
    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    text = read_text(args.file)
    options = options_from(args)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError("`steerc run` needs torch and transformers: pip install 'steerc[hf]'") from None
    if not os.path.exists(args.model):
        raise UsageError(f"--model {args.model}: no such folder or file")
    from steerc.api import check_source
    from steerc.runtime.hf import facts_from_model, install
    from steerc.runtime.models import encode_prompt, load_model

    try:
        model, tokenizer = load_model(args.model)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load {args.model}: {exc}") from None
    result = check_source(text, args.file, path=os.path.abspath(args.file), options=options,
                          facts=facts_from_model(model))
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


def _complete(model, tokenizer, inputs, max_new_tokens: int) -> str:
    import torch

    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
