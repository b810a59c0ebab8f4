"""The formats seat: other tools' steering files, each one module and one entry in :data:`FORMATS`.

A :class:`Format` says how ``steerc import`` recognises a file (its suffixes, or ``sniff`` on its first bytes),
how it reads it (``convert``: the foreign file into a ``.steer`` program's text and the vector files the
program loads, or a :class:`ForeignFileError` for what is malformed), and which ``steerc compile --target``
(and ``--dialect``) writes it back, when one does (``export``). The command line (``steerc import``'s
``--from`` choices and help, the unknown-format message) reads the table, so a new format (lm-eval's
``steered`` config, vLLM-Hook's ``intervention_spec``, EasySteer's ``SteeringSpec``) is one module here and
one entry below: its exporter, if any, is a target (``steerc/targets/<name>/`` and its registry entry).

Every importer treats its input as hostile: bounded reads, nothing executed, and every malformed field a
:class:`ForeignFileError` with the place to blame; it writes nothing (the command writes what it returns).

>>> {"brainpatch", "vllm-hook"} <= set(FORMATS), format_for("a/b/JOY.brainpatch").name
(True, 'brainpatch')
>>> format_for("x.json") is None
True
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field


class ForeignFileError(Exception):
    """A foreign file that cannot be imported: ``message``, and where to put the caret — ``source`` (a
    :class:`~steerc.core.source.Source` of the text at fault, such as an archive's manifest) and ``span`` in it,
    or neither (the file as a whole: the command points at its argument)."""

    def __init__(self, code: str, message: str, help: str | None = None, source=None, span=None):
        super().__init__(message)
        self.code, self.message, self.help, self.source, self.span = code, message, help, source, span


@dataclass(frozen=True)
class Imported:
    """What an importer makes: the program's text (``steerc import`` formats it as ``steerc fmt`` would),
    the files it loads (name beside the program -> bytes) and a line per thing the user should know."""

    text: str
    files: dict[str, bytes] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Format:
    name: str  # `steerc import --from NAME`
    help: str  # one line: what it is
    suffixes: tuple[str, ...]  # lower case, with the dot
    # convert(path, stem) -> Imported: ``stem`` names the files written beside the program (``stem.safetensors``)
    convert: Callable[[str, str], Imported]
    sniff: Callable[[bytes], bool] | None = None  # the file's first 64 bytes -> whether it is this format
    export: tuple[str, str] | None = None  # (--target, --dialect) that writes it, if any
    # whether its files name SAEs by id, found in a folder of SAELens folders (`steerc import --sae-root DIR`):
    # convert then takes sae_root= (the folder, or None) and out_dir= (where the program will be written)
    sae_root: bool = False
    spec: str = "spec/formats.md"  # where its mapping table is


def _brainpatch(path: str, stem: str) -> Imported:
    from steerc.formats.brainpatch import convert

    return convert(path, stem)


def lazy(module: str, name: str) -> Callable:
    """``module.name``, imported when first called: a table entry names its importer without loading it (the
    command line reads the table for its help)."""
    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"{module}.{name}"
    return call


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("brainpatch", "a BrainPatch archive (.brainpatch, format 1.0): a ZIP of a manifest and its vectors",
           (".brainpatch",), _brainpatch, export=("brainpatch", "steerc")),
    Format("lm-eval", "lm-eval's `steered` model config (.csv; its .pt pickle is refused)", (".csv", ".pt", ".pth"),
           lazy("steerc.formats.lm_eval", "convert"), sae_root=True, export=("lm-eval", "steerc")),
    Format("vllm-hook", "a vLLM-Hook intervention_spec (JSON {\"ops\": ...}, or its request.json) and its "
           "sha256-named artifacts", (), lazy("steerc.formats.vllm_hook", "convert"),
           sniff=lazy("steerc.formats.vllm_hook", "sniff"), export=("serve", "vllm-hook")),
    Format("neuronpedia", "a Neuronpedia steering request (JSON: SAE features by Neuronpedia id, or vectors at "
           "TransformerLens hooks); its SAEs from --sae-root", (), lazy("steerc.formats.neuronpedia", "convert"),
           sniff=lazy("steerc.formats.neuronpedia", "sniff"), sae_root=True),
    Format("easysteer", "an EasySteer SteeringSpec (JSON, its v2 API) and the .gguf vectors it names", (),
           lazy("steerc.formats.easysteer", "convert"), export=("easysteer", "steerc")),
)}


def format_for(path: str, head: bytes = b"") -> Format | None:
    """The format of ``path``: the first whose suffix it has, else whose ``sniff`` accepts its first bytes."""
    ext = os.path.splitext(path)[1].lower()
    found = next((f for f in FORMATS.values() if ext in f.suffixes), None)
    if found is None and head:
        found = next((f for f in FORMATS.values() if f.sniff is not None and f.sniff(head)), None)
    return found


__all__ = ["FORMATS", "ForeignFileError", "Format", "Imported", "format_for", "lazy"]
