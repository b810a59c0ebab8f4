"""``steerc lsp [--model PATH]``: the language server, over standard input and output.

It needs the ``lsp`` extra (pygls and lsprotocol); the compiler itself never imports them.
"""

from __future__ import annotations

from steerc.cli import UsageError

SERVER_PACKAGES = ("pygls", "lsprotocol", "cattrs")


def add_arguments(cmd) -> None:
    cmd.add_argument("--stdio", action="store_true", help="talk over standard input and output (the default)")
    cmd.add_argument("--model", metavar="PATH",
                     help="check every document against this model (default: `model` in the nearest steer.toml)")


def run(args) -> int:
    try:
        from steerc.lsp.stdio import serve
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        raise UsageError(f'the language server needs pygls and lsprotocol ({exc.name} is missing): '
                         'pip install "steerc[lsp]"') from None
    return serve(model=args.model)
