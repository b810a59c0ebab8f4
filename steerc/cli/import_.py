"""``steerc import FILE -o OUT.steer [--model M] [--force]``: another tool's steering file as a Steer program.

The format comes from the file's suffix (or ``--from``), through the formats seat (``steerc.formats``). The
program is written as ``steerc fmt`` writes it, the vectors it loads beside it; all of it is first written
into a temporary folder beside ``OUT`` and checked there (against ``--model`` when given: its layers, its
hidden size, the ``model {}`` block), and moved into place only when the check has no errors, so a failure
leaves nothing behind. An existing ``OUT`` or vector file is replaced only with ``--force`` (keeping its
mode), a symbolic link never.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.common import MODEL_HELP, argument_word, facts_from, fail_with


def add_arguments(cmd) -> None:
    from steerc.formats import FORMATS  # a table of small records: nothing heavy is imported

    cmd.add_argument("file", metavar="FILE", help="the file to import: " + "; ".join(
        f"{f.help}" for f in FORMATS.values()) + " (spec/formats.md)")
    cmd.add_argument("-o", "--output", metavar="OUT", required=True,
                     help="the .steer file to write; the vectors it loads are written beside it (OUT's name with "
                          ".safetensors)")
    cmd.add_argument("--model", metavar="PATH", help=f"check the program against this model: {MODEL_HELP}")
    cmd.add_argument("--root", metavar="DIR",
                     help="project root the written files must stay inside (default: the nearest steer.toml "
                          "above OUT)")
    cmd.add_argument("--from", dest="source_format", metavar="FORMAT", choices=tuple(FORMATS),
                     help=f"the file's format, when its suffix does not say ({', '.join(FORMATS)})")
    cmd.add_argument("--force", action="store_true", help="replace OUT and its vector file if they exist")
    cmd.add_argument("--sae-root", metavar="DIR", help="for a format that names SAEs by id (" + ", ".join(
        f.name for f in FORMATS.values() if f.sae_root) + "): the folder holding them as SAELens folders "
        "(spec/formats.md)")


def run(args) -> int:
    from steerc.formats import FORMATS, ForeignFileError, format_for

    fmt = FORMATS[args.source_format] if args.source_format else format_for(args.file, _head(args.file))
    if fmt is None:
        known = ", ".join(f"{f.name} ({', '.join(f.suffixes)})" for f in FORMATS.values())
        raise UsageError(f"{args.file}: not a format steerc imports (it reads {known}); name it with --from")
    if not os.path.isfile(args.file):
        raise UsageError(f"no such file: {args.file}" if not os.path.exists(args.file)
                         else f"{args.file} is not a file")
    out = args.output
    if not out.endswith(".steer") or os.path.basename(out) == ".steer":
        raise UsageError(f"-o {out}: the program's name must end in .steer")
    folder = os.path.dirname(os.path.abspath(out))
    root = _root(args, folder)
    facts = facts_from(args) if args.model is not None else None  # a bad model: before the file is read
    stem = os.path.basename(out)[:-len(".steer")]
    extra = {"sae_root": args.sae_root, "out_dir": folder} if fmt.sae_root else {}
    if args.sae_root is not None and not extra:
        raise UsageError("--sae-root is for formats that name SAEs by id ("
                         + ", ".join(f.name for f in FORMATS.values() if f.sae_root) + f"), not {fmt.name}")
    try:
        imported = fmt.convert(args.file, stem, **extra)
    except ForeignFileError as exc:
        return _refuse(args, exc)
    text = _formatted(imported.text, out)
    targets = [out, *(os.path.join(os.path.dirname(out), name) for name in imported.files)]
    _may_write(targets, args.force, root)
    return _write_checked(args, text, imported, targets, folder, root, facts)


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(64)
    except OSError:
        return b""


def _root(args, folder: str) -> str:
    from steerc.core.paths import find_root, resolve

    if args.root is None:
        return find_root(folder) if os.path.isdir(folder) else os.path.realpath(folder)
    if not os.path.isdir(args.root):
        raise UsageError(f"--root {args.root}: no such folder")
    if resolve(folder, os.getcwd(), args.root).escapes:
        raise UsageError(f"-o {args.output}: outside the project root {args.root}; steerc writes only inside it")
    return os.path.realpath(args.root)


def _refuse(args, exc) -> int:
    from steerc.diagnostics import Diagnostic

    source, span = (exc.source, exc.span) if exc.source is not None else argument_word(args, args.file)
    return fail_with(args, [Diagnostic.error(exc.code, exc.message, span, help=exc.help)], {source.name: source})


def _formatted(text: str, out: str) -> str:
    """``text`` as ``steerc fmt`` writes it (an importer's text that does not parse is a steerc bug)."""
    from steerc.core.source import Source
    from steerc.frontend.fmt import MeaningChanged, format_source

    try:
        formatted, diagnostics = format_source(Source(out, text))
    except MeaningChanged:
        formatted, diagnostics = None, []
    if formatted is None:
        detail = "; ".join(d.message for d in diagnostics[:3])
        raise UsageError(f"the program made for {out} does not parse ({detail}): a bug in steerc import, "
                         "please report it with the file")
    return formatted


def _may_write(targets: list[str], force: bool, root: str) -> None:
    """Refuse, before anything is written, to replace what the user has without ``--force``, or a link ever."""
    from steerc.core.paths import where_to_write

    problem = where_to_write(os.path.dirname(os.path.abspath(targets[0])) or ".", holding=targets[0])
    if problem is not None:
        raise UsageError(problem)
    for path in targets:
        real = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        if not (real == root or real.startswith(root.rstrip(os.sep) + os.sep)):
            raise UsageError(f"{path}: outside the project root {root}; steerc writes only inside it")
        if os.path.islink(path):
            raise UsageError(f"{path} is a symbolic link; steerc import does not replace links (remove it, or "
                             "choose another -o)")
        if os.path.isdir(path):
            raise UsageError(f"{path} is a folder")
        if os.path.lexists(path) and not force:
            raise UsageError(f"{path} exists; steerc import does not replace a file unless told to (--force, or "
                             "choose another -o)")


def _write_checked(args, text: str, imported, targets: list[str], folder: str, root: str, facts) -> int:
    from steerc.api import Options, check_source

    os.makedirs(folder, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".steerc-import-", dir=folder)
    try:
        for name, data in [(os.path.basename(targets[0]), text.encode("utf-8")), *imported.files.items()]:
            with open(os.path.join(tmp, name), "wb") as fh:
                fh.write(data)
        result = check_source(text, args.output, path=os.path.join(tmp, os.path.basename(targets[0])),
                              options=Options(root=root, base_dir=tmp if imported.files else folder), facts=facts)
        if result.diagnostics:
            print(result.render(), file=sys.stderr)
        if not result.ok:
            print(f"nothing written: the program {args.output} would be has errors"
                  + (" against this model" if facts is not None else ""), file=sys.stderr)
            return EXIT_ERRORS
        for path in [*targets[1:], targets[0]]:  # the vectors first: the program never names a missing file
            made = os.path.join(tmp, os.path.basename(path))
            if os.path.lexists(path):
                os.chmod(made, os.stat(path).st_mode & 0o7777)
            os.replace(made, path)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    for path in targets:
        print(path)
    return EXIT_OK
