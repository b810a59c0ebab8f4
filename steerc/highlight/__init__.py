"""Syntax highlighting for Steer: the word classes, a Pygments lexer, the TextMate grammar.

:mod:`steerc.highlight.words` holds the classes (no dependencies);
:mod:`steerc.highlight.pygments_lexer` needs Pygments (the ``highlight``
extra) and is what the ``pygments.lexers`` entry point names;
:mod:`steerc.highlight.textmate` writes ``editors/vscode/syntaxes/steer.tmLanguage.json``.
The compiler itself never imports this package.
"""
