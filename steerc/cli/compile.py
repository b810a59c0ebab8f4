"""``steerc compile FILE --model PATH --target TARGET -o OUT``: every target of the registry."""

from __future__ import annotations

import os
import shlex
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.arguments import refuse
from steerc.cli.common import add_program_options, checked_project, facts_from, options_from, read_text, required
from steerc.cli.report import summary
from steerc.targets.output import clear, folder_problem, record
from steerc.targets.registry import DIALECTS, REGISTRY, TARGET_NAMES, dialects_of, selected


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file")
    add_program_options(cmd, model_required=True)
    steerc_dialect = [t for t in REGISTRY.values() if t.dialect == "steerc"]
    cmd.add_argument("--target", choices=TARGET_NAMES,
                     help="; ".join(f"{t.name}: {t.help}" for t in steerc_dialect)
                          + " (required: here or as `target` in steer.toml)")
    cmd.add_argument("-o", "--output", metavar="OUT", required=True,
                     help="output folder: new, empty, or one an earlier compile wrote (whose files this compile "
                          "does not write again are removed)")
    others = ", ".join(f"{t.dialect} (--target {t.selected_by[0]}: {t.help})" for t in REGISTRY.values()
                       if t.dialect != "steerc")
    cmd.add_argument("--dialect", choices=DIALECTS, default="steerc",
                     help=f"the format within a target: steerc's own, or {others}")
    signing = " and ".join(f"--target {t.name}" for t in steerc_dialect if t.signs)
    cmd.add_argument("--hmac-key-file", metavar="KEY",
                     help=f"{signing}: sign the plan with HMAC-SHA256 under this key (at least 16 bytes), for "
                          "engines and servers that accept only signed plans")
    cmd.add_argument("--no-xgrammar", action="store_true",
                     help="do not cross-check constraints with xgrammar even when it is installed")


def _xgrammar_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("xgrammar") is not None


class _Weights:
    """The model a target builds from (``needs_model``): called, loaded as ``steerc run`` loads it; ``path``
    the weights to load, for a target that reads them itself, tensor by tensor (``--target weights``)."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self):
        from steerc.runtime.models import load_model

        model, _ = load_model(self.path)
        return model

    def safetensors_folder(self) -> str:
        """The weights as a folder of safetensors: the folder itself, or for a .gguf the dequantized copy steerc
        keeps in its cache (made by loading the model once, as `steerc run` does)."""
        from steerc.runtime.models import cache_complete, gguf_cache_folder

        if not self.path.endswith(".gguf") or os.path.isdir(self.path):
            return self.path
        folder = gguf_cache_folder(self.path)
        if not cache_complete(folder):
            self()
        return folder


def run(args) -> int:
    from steerc.api import check_source
    from steerc.targets import check_target

    project = checked_project(args, args.file)
    required(args, project, "model")
    args.target = required(args, project, "target")
    target = selected(args.target, args.dialect)
    if target is None:
        raise UsageError(f"--dialect {args.dialect} does not apply to --target {args.target} (its dialects: "
                         f"{', '.join(dialects_of(args.target))})")
    key = None
    if args.hmac_key_file:
        if not target.signs:
            signers = ", ".join(f"--target {t.name}" for t in REGISTRY.values() if t.signs)
            raise UsageError(f"--hmac-key-file applies to {signers} (steerc's dialect)")
        from steerc.targets.signing import read_key

        try:
            key = read_key(args.hmac_key_file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--hmac-key-file: {exc}") from None
    problem = folder_problem(args.output)
    if problem is not None:  # before the program is checked and any model loads
        return refuse(args, ("-o", "--output"), problem, help="give a new or empty folder, or one steerc wrote")
    facts = facts_from(args, project)
    options = options_from(args, project, use_xgrammar=not args.no_xgrammar and _xgrammar_available())
    result = check_source(read_text(args.file), args.file, path=os.path.abspath(args.file),
                          options=options, facts=facts)
    check_target(result, target.name)
    if result.diagnostics:  # as `check` prints them, its summary line last
        errors = sum(d.is_error for d in result.diagnostics)
        print(result.render() + "\n\n" + summary(1, errors, len(result.diagnostics) - errors), file=sys.stderr)
    if not result.ok:
        return EXIT_ERRORS
    command = _command(args)
    extra = {}
    if target.needs_model:  # weights, before anything is built (a model without them is a diagnostic)
        from steerc.cli.common import model_path_for

        path = model_path_for(args)
        extra["model"] = _Weights(path)
    if target.reads_program:  # what the plan's numbers do not keep (lm-eval: an SAE's folder and feature index)
        extra["result"] = result
    try:
        _, kept = clear(args.output)  # the previous compile's files: this one's are all written afresh
        written = target.emit(result.plan, result.facts, args.output, command=command, key=key, **extra)
        record(args.output, written)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    for name in (n for n in kept if n not in written):
        print(f"note: kept {os.path.join(args.output, name)}: an earlier compile wrote it and it has changed "
              "since", file=sys.stderr)
    for name in written:
        print(os.path.join(args.output, name))
    return EXIT_OK


def _command(args) -> str:
    """How to remake the output (no output folder: the bytes must not depend on it)."""
    parts = ["steerc", "compile", os.path.basename(args.file), "--target", args.target]
    if args.dialect != "steerc":
        parts += ["--dialect", args.dialect]
    for item in args.overrides:
        parts += ["--set", item]
    return shlex.join(parts)  # every word quoted: pasting it runs steerc and nothing else
