"""``steerc lsp``: the language server for ``.steer`` files (see spec/lsp.md).

``server`` and ``features`` speak the protocol through pygls and lsprotocol (the ``lsp`` extra);
the other modules are plain Python over steerc's own values: ``positions`` (LSP positions and
documents), ``project`` (which model a document is checked against), ``reparse`` (re-parsing only
what an edit touched), ``analysis`` (names and what is at an offset), ``hover``, ``complete`` and
``wire`` (steerc's values as LSP messages). Only ``steerc.cli.lsp`` imports this package.
"""
