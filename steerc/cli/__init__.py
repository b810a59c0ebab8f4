"""The ``steerc`` command line.

Exit codes: 0 when clean or warnings only, 1 when the input has errors, 2
when the command itself cannot run (bad arguments, unreadable files).
Each subcommand lives in its own module and is imported only when used, so
``steerc check`` stays quick to start.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from steerc import __version__

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2

# subcommand -> (module under steerc.cli, one-line help)
COMMANDS = {
    "check": ("check", "check programs (and their layout against a model, with --model)"),
    "fmt": ("fmt", "format programs in the canonical layout"),
    "parse": ("parse", "print the parse tree (--emit ast) or the IR as JSON (--emit ir)"),
    "facts": ("facts", "print a model's layout facts and site table as JSON"),
    "explain": ("explain", "show the per-site plan a program compiles to"),
    "compile": ("compile", "compile a program for a target ({targets})"),
    "import": ("import_", "import another tool's steering file (a BrainPatch archive) as a program and its vectors"),
    "run": ("run", "steer a Hugging Face model with a program and print the completion"),
    "serve": ("serve", "run vLLM's OpenAI-compatible server with the steerc plugin (per-request plans)"),
    "derive": ("derive", ("make steering vectors from contrastive data (mean difference, PCA, logistic), or "
                          "calibrate a probe's threshold")),
    "capture": ("capture", ("read activations at sites over texts into a safetensors file, with provenance "
                            "(--engine {engines})")),
    "eval": ("eval", ("measure programs' effect (behaviour pairs) and cost (KL, perplexity) on data, over a "
                      "sweep of their params")),
    "tune": ("tune", ("pick a program's params by a rule over eval's metrics (--maximize behavior --subject-to "
                      "\"kl<=0.1\") and write them into steer.toml [params]")),
    "lsp": ("lsp", ("the language server (diagnostics, hover, definitions, rename, formatting, completion) "
                    "over stdio; needs steerc[lsp]")),
}

# Commands whose arguments after `--` belong to the program they start.
PASSTHROUGH = {"serve"}


class UsageError(Exception):
    """A problem with the command itself (exit code 2)."""


class NotAProgram(Exception):
    """A program file whose bytes are not UTF-8: its ``invalid-encoding`` diagnostic and the source it points
    into (exit code 1, as for any error in a program)."""

    def __init__(self, diagnostic, source):
        super().__init__(diagnostic.message)
        self.diagnostic, self.source = diagnostic, source


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="steerc",
        description="steerc: a compiler for declarative LLM interventions (.steer files).",
    )
    parser.add_argument("--version", action="version", version=f"steerc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, _) in COMMANDS.items():
        help_text = command_help(name)
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        _module(module).add_arguments(cmd)
    return parser


def command_help(name: str) -> str:
    """``name``'s one-line help; compile's names the targets of the registry, capture's the engines of theirs
    (importing it only then)."""
    help_text = COMMANDS[name][1]
    if "{targets}" in help_text:
        from steerc.targets.registry import TARGET_NAMES

        help_text = help_text.format(targets=", ".join(TARGET_NAMES))
    if "{engines}" in help_text:
        from steerc.runtime.engines import names

        *rest, last = names()
        help_text = help_text.format(engines=f"{', '.join(rest)} or {last}" if rest else last)
    return help_text


def _module(name: str):
    return importlib.import_module(f"steerc.cli.{name}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    passthrough = None
    if argv and argv[0] in PASSTHROUGH and "--" in argv:  # the rest goes to another program unparsed
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    empty = _dashes_as_value(argv)
    if empty is not None:
        where = f"steerc {argv[0]}" if argv[0] in COMMANDS else "steerc"
        print(f"{where}: error: argument {empty}: '--' is not a value (it ends the options; a file named -- is "
              "./--)", file=sys.stderr)
        return EXIT_USAGE
    nul = next((i for i, word in enumerate(argv) if "\0" in word), None)
    if nul is not None:  # no path or value holds one (a shell cannot pass it; a caller of main() can)
        print(f"steerc: error: argument {nul + 1} holds a NUL character, which no path or value may",
              file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser() if _needs_full_parser(argv) else _single_command_parser(argv)
    try:
        args = parser.parse_args(argv)
        if argv and argv[0] in PASSTHROUGH:
            args.passthrough = passthrough or []
    except SystemExit as exc:  # argparse already printed the problem
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args.argv = list(argv)  # diagnostics about an argument point into the command line
    try:
        return _module(COMMANDS[args.command][0]).run(args)
    except SystemExit as exc:  # a subcommand that already printed its diagnostic
        return exc.code if isinstance(exc.code, int) else EXIT_ERRORS
    except UsageError as exc:
        from steerc.core.text import shown  # a path or value from the user may hold control characters

        print(f"steerc {args.command}: error: {shown(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except NotAProgram as exc:
        from steerc.diagnostics import render_text

        print(render_text(exc.diagnostic, {exc.source.name: exc.source}), file=sys.stderr)
        return EXIT_ERRORS
    except ValueError as exc:  # a Refusal raised below the command (a kernel a target cannot lower, ...)
        from steerc.diagnostics import Refusal

        if not isinstance(exc, Refusal):
            raise
        print(exc.render(), file=sys.stderr)
        return EXIT_ERRORS
    except KeyboardInterrupt:
        print("steerc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


def _dashes_as_value(argv: list[str]) -> str | None:
    """The flag of the first ``--flag=--`` (or ``-o--``, ``-o=--``) before a bare ``--``, else None.

    argparse drops a ``--`` it finds among an option's values, even one glued to the option, so such an
    option's value becomes an empty list, which no command expects (``--data=--`` was a traceback, and
    ``check --model=--`` checked against no model): refused here, once for every command.

    >>> _dashes_as_value(["eval", "p.steer", "--data=--"]), _dashes_as_value(["capture", "x", "-o--"])
    ('--data', '-o')
    >>> _dashes_as_value(["check", "--", "--model=--"]) is None, _dashes_as_value(["eval", "--data=---"]) is None
    (True, True)
    """
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            continue
        flag, sep, value = word.partition("=")
        if sep and value == "--":
            return flag
        if not word.startswith("--") and len(word) == 4 and word[2:] == "--":
            return word[:2]
    return None


def _needs_full_parser(argv: list[str]) -> bool:
    return not argv or argv[0] not in COMMANDS


def _single_command_parser(argv: list[str]) -> argparse.ArgumentParser:
    """A parser knowing only the requested subcommand: imports stay minimal."""
    parser = argparse.ArgumentParser(prog="steerc")
    parser.add_argument("--version", action="version", version=f"steerc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    module = COMMANDS[argv[0]][0]
    help_text = command_help(argv[0])
    cmd = sub.add_parser(argv[0], help=help_text, description=help_text)
    _module(module).add_arguments(cmd)
    return parser


def entry() -> None:  # console script
    # A file name that is not valid UTF-8 decodes to lone surrogates; print them as escapes, never fail on them.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    sys.exit(main())
