"""``steerc compile FILE --model PATH --target hf|vllm|serve|llamacpp -o OUT``."""

from __future__ import annotations

import os
import shlex
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.common import add_program_options, checked_project, facts_from, options_from, read_text, required
from steerc.project import TARGET_NAMES


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file")
    add_program_options(cmd, model_required=True)
    cmd.add_argument("--target", choices=TARGET_NAMES,
                     help="hf: a Python package of hooks; vllm: plan.msgpack for vLLM workers; "
                          "serve: plan.json for per-request steering on a vLLM server; "
                          "llamacpp: control_vector.gguf for llama.cpp's --control-vector (required: here or as "
                          "`target` in steer.toml)")
    cmd.add_argument("-o", "--output", metavar="OUT", required=True, help="output folder")
    cmd.add_argument("--dialect", choices=("steerc", "vllm-hook"), default="steerc",
                     help="serve target only: steerc's own format, or IBM vLLM-Hook's spec")
    cmd.add_argument("--hmac-key-file", metavar="KEY",
                     help="vllm and serve targets: sign the plan with HMAC-SHA256 under this key (at least 16 "
                          "bytes), for engines and servers that accept only signed plans")
    cmd.add_argument("--no-xgrammar", action="store_true",
                     help="do not cross-check constraints with xgrammar even when it is installed")


def _xgrammar_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("xgrammar") is not None


def run(args) -> int:
    from steerc.api import check_source
    from steerc.targets import check_target

    project = checked_project(args, args.file)
    required(args, project, "model")
    args.target = required(args, project, "target")
    if args.dialect != "steerc" and args.target != "serve":
        raise UsageError("--dialect applies to --target serve only")
    key = None
    if args.hmac_key_file:
        if args.target in ("hf", "llamacpp") or args.dialect != "steerc":
            raise UsageError("--hmac-key-file applies to --target vllm and --target serve (steerc's dialect)")
        from steerc.targets.signing import read_key

        try:
            key = read_key(args.hmac_key_file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--hmac-key-file: {exc}") from None
    facts = facts_from(args, project)
    options = options_from(args, project, use_xgrammar=not args.no_xgrammar and _xgrammar_available())
    result = check_source(read_text(args.file), args.file, path=os.path.abspath(args.file),
                          options=options, facts=facts)
    target_caps = "vllm-hook" if args.dialect == "vllm-hook" else args.target
    check_target(result, target_caps)
    if args.dialect == "vllm-hook":
        from steerc.targets.vllm_hook.lower import check_vllm_hook

        check_vllm_hook(result)
    if result.diagnostics:
        print(result.render(), file=sys.stderr)
    if not result.ok:
        return EXIT_ERRORS
    command = _command(args)
    written = _emit(result, args, command, key)
    for name in written:
        print(os.path.join(args.output, name))
    return EXIT_OK


def _command(args) -> str:
    """How to remake the output (no output folder: the bytes must not depend on it)."""
    parts = ["steerc", "compile", os.path.basename(args.file), "--target", args.target]
    if args.dialect != "steerc":
        parts += ["--dialect", args.dialect]
    parts += [f"--set {k}" for k in args.overrides]
    return " ".join(shlex.quote(p) if " " not in p else p for p in parts)


def _emit(result, args, command: str, key: bytes | None = None) -> list[str]:
    try:
        if args.target == "hf":
            from steerc.targets.hf.emit import emit
            from steerc.targets.hooks import lower_hf

            return emit(lower_hf(result.plan, result.facts), args.output, command)
        if args.target == "vllm":
            from steerc.targets.vllm.emit import emit

            return emit(result.plan, result.facts, args.output, key)
        if args.target == "llamacpp":
            from steerc.targets.llamacpp.emit import emit

            return emit(result.plan, result.facts, args.output, command)
        if args.dialect == "vllm-hook":
            from steerc.targets.vllm_hook.emit import emit_vllm_hook

            return emit_vllm_hook(result.plan, result.facts, args.output)
        from steerc.targets.serve.emit import emit

        return emit(result.plan, result.facts, args.output, key=key)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc}") from None
