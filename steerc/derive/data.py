"""The examples `steerc derive` learns from, read with diagnostics that point into the data files.

Two forms:

* **JSONL pairs** — one JSON object per line: ``{"positive": TEXT,
  "negative": TEXT}``, optionally with ``"prompt": TEXT``. Without a prompt,
  each side is a whole text (with ``--chat``, a user message). With one, the
  sides are two completions of the same prompt (with ``--chat``: the user
  message and two assistant replies), and ``--read completion`` averages
  over the completion's tokens only. Blank lines are skipped; other keys are
  refused (a typo like ``"postive"`` should not pass silently).
* **two text files** — one example per non-blank line, paired by line for
  the methods that need pairs (then their counts must agree:
  ``unbalanced-data``); ``--calibrate`` takes two sets of any sizes.

Every fault is a diagnostic with a code and a caret: ``invalid-data`` (not
JSON, not an object, a missing or unknown key, a non-string or empty text,
over the size limits), ``unbalanced-data``, ``empty-data``.

>>> from steerc.core.source import Source
>>> ds = parse_pairs(Source("d.jsonl", '{"positive": "yes", "negative": "no"}\\n'))
>>> ds.pairs[0].positive, len(ds.pairs), ds.sha256[:12]  # sha256sum of the bytes
('yes', 1, 'a456fb0f08f8')
"""

from __future__ import annotations

import hashlib

from steerc.core.jsonio import JSONError, loads
from steerc.core.limits import MAX_DATA_BYTES, MAX_EXAMPLE_CHARS, MAX_EXAMPLES, MAX_REPEATS, human
from steerc.core.record import field, frozen
from steerc.core.source import Source, Span
from steerc.diagnostics import Diagnostic, Note
from steerc.diagnostics.codes import EMPTY_DATA, INVALID_DATA, UNBALANCED_DATA
from steerc.diagnostics.suggest import did_you_mean

KEYS = ("positive", "negative", "prompt")


class DataError(Exception):
    """Data that cannot be used; ``diagnostics`` say why, ``sources`` hold the files they point into."""

    def __init__(self, diagnostics: list[Diagnostic], sources: dict[str, Source]):
        super().__init__("; ".join(d.message for d in diagnostics))
        self.diagnostics = diagnostics
        self.sources = sources


@frozen
class Pair:
    positive: str
    negative: str
    prompt: str | None = None
    # Where each text was written ("positive", "negative", "prompt" -> Span), for the diagnostics found only
    # once the texts are tokenized (a text over the model's context); empty for pairs made in code.
    spans: dict = field(factory=dict, eq=False, repr=False)


@frozen
class Dataset:
    pairs: tuple[Pair, ...]
    # The sha256 of the data files' bytes, one file after the other (``sha256sum pairs.jsonl``; ``cat POS NEG |
    # sha256sum``): what the bank records (spec/derive.md). ``file_sha256s``: each file's, what the activation
    # cache is keyed on: "a\nb\nx" + "yz\nd\ne\n" and "a\nb\nxy" + "z\nd\ne\n" join to the same bytes, other pairs.
    sha256: str
    files: tuple[str, ...]
    file_sha256s: tuple[str, ...] = ()
    sources: dict = field(factory=dict, eq=False, repr=False)  # {name: Source}: what the pairs' spans point into


def read_source(path: str) -> Source:
    """A data file as a Source (OSError when it cannot be read; DataError when it is too big or not UTF-8)."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_DATA_BYTES + 1)
    if len(data) > MAX_DATA_BYTES:
        raise DataError([Diagnostic.error(INVALID_DATA, f"{path} is larger than the "
                                          f"{human(MAX_DATA_BYTES, 'bytes')} steerc reads in a data file", None,
                                          help="split the data, or sample it")], {})
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        src = Source(path, data.decode("utf-8", errors="replace"), path)
        raise DataError([Diagnostic.error(INVALID_DATA, f"not UTF-8 ({exc.reason})",
                                          src.span(exc.start, exc.start + 1))], {src.name: src}) from None
    return Source(path, text, path)


def data_lines(src: Source):
    """(offset, line text) of each non-blank line."""
    offset = 0
    for line in src.text.split("\n"):
        if line.strip():
            yield offset, line.rstrip("\r")
        offset += len(line) + 1


def text_ok(value, where: str, span, problems: list) -> bool:
    if not isinstance(value, str):
        problems.append(Diagnostic.error(INVALID_DATA, f"{where} is {type(value).__name__}, not a string", span))
        return False
    if not value.strip():
        problems.append(Diagnostic.error(INVALID_DATA, f"{where} is empty", span,
                                         help="every line needs some text"))
        return False
    if len(value) > MAX_EXAMPLE_CHARS:
        problems.append(Diagnostic.error(INVALID_DATA, f"{where} has {len(value):,} characters, over the "
                                         f"{human(MAX_EXAMPLE_CHARS)} steerc reads in one text", span))
        return False
    return True


def _too_many(src: Source, offset: int) -> Diagnostic:
    return Diagnostic.error(INVALID_DATA, f"more than {human(MAX_EXAMPLES)} examples", src.span(offset, offset + 1),
                            help="sample the data; a few hundred pairs are plenty for a direction")


def json_rows(src: Source, problems: list, example: str):
    """(offset, line, object) of each line of a JSONL file that is a JSON object; the other lines add a
    diagnostic to ``problems`` (``example``: the one-line shape a row should have). Stops at MAX_REPEATS
    problems (enough to fix the file by; storing more is unbounded work) or after MAX_EXAMPLES rows."""
    rows = 0
    for offset, line in data_lines(src):
        if len(problems) >= MAX_REPEATS:
            return
        if rows >= MAX_EXAMPLES:
            problems.append(_too_many(src, offset))
            return
        try:
            row = loads(line, unique_keys=True)
        except JSONError as exc:
            at = offset + (exc.offset or 0)
            problems.append(Diagnostic.error(INVALID_DATA, f"not a JSON object ({exc.message})",
                                             src.span(at, min(at + 1, offset + len(line))),
                                             help=f"one object per line: {example}"))
            continue
        if not isinstance(row, dict):
            problems.append(Diagnostic.error(INVALID_DATA, f"a JSON {type(row).__name__}, not an object",
                                             src.span(offset, offset + len(line)),
                                             help=f"one object per line: {example}"))
            continue
        rows += 1
        yield offset, line, row


def parse_pairs(src: Source) -> Dataset:
    """The pairs of a JSONL file (raises DataError with every problem found, up to the repeat limit)."""
    problems: list[Diagnostic] = []
    pairs: list[Pair] = []
    for offset, line, row in json_rows(src, problems, '{"positive": "...", "negative": "..."}'):
        unknown = [k for k in row if k not in KEYS]
        missing = [k for k in ("positive", "negative") if k not in row]
        if unknown or missing:
            what = (f"unknown key {unknown[0]!r}" if unknown else f"no {missing[0]!r}")
            problems.append(Diagnostic.error(INVALID_DATA, f"{what} (a pair has \"positive\", \"negative\" and "
                                             "optionally \"prompt\")", key_span(src, offset, line, unknown),
                                             help=did_you_mean_key(unknown, KEYS)))
            continue
        spans = {k: key_span(src, offset, line, [k]) for k in KEYS if k in row}
        checked = [text_ok(row[k], f'"{k}"', spans[k], problems) for k in spans]  # each text's problems, not the first
        if all(checked):
            pairs.append(Pair(row["positive"], row["negative"], row.get("prompt"), spans))
    if not problems and not pairs:
        problems.append(Diagnostic.error(EMPTY_DATA, "no pairs in this file", src.span(0, min(1, len(src.text))),
                                         help='one JSON object per line: {"positive": "...", "negative": "..."}'))
    if problems:
        raise DataError(problems, {src.name: src})
    return Dataset(tuple(pairs), sha256_of(src), (src.name,), _file_sha256s(src), {src.name: src})


def key_span(src: Source, offset: int, line: str, keys):
    for k in keys:
        at = line.find(f'"{k}"')
        if at >= 0:
            return src.span(offset + at, offset + at + len(k) + 2)
    return src.span(offset, offset + len(line))


def did_you_mean_key(unknown, keys) -> str | None:
    return did_you_mean(unknown[0], list(keys)) if unknown else None


def parse_lines(src: Source) -> list[str]:
    """The examples of a text file: one per non-blank line."""
    return [line for line, _ in lines_at(src)]


def lines_at(src: Source) -> list[tuple[str, Span]]:
    """(example, the span of its line) of each non-blank line of a text file (raises DataError)."""
    problems: list[Diagnostic] = []
    out = []
    for offset, line in data_lines(src):
        if len(out) >= MAX_EXAMPLES:
            problems.append(_too_many(src, offset))
            break
        span = src.span(offset, offset + len(line))
        if text_ok(line, "this line", span, problems):
            out.append((line, span))
    if not problems and not out:
        problems.append(Diagnostic.error(EMPTY_DATA, "no examples in this file (one per line)",
                                         src.span(0, min(1, len(src.text)))))
    if problems:
        raise DataError(problems, {src.name: src})
    return out


def paired_lines(pos: Source, neg: Source) -> Dataset:
    """Pairs from two text files, line by line (``unbalanced-data`` when the counts differ)."""
    a, b = _both(pos, neg)
    sources = {pos.name: pos, neg.name: neg}
    if len(a) != len(b):
        longer, shorter = (pos, neg) if len(a) > len(b) else (neg, pos)
        extra = list(data_lines(longer))[min(len(a), len(b))][0]
        raise DataError([Diagnostic.error(
            UNBALANCED_DATA, f"{longer.name} has {max(len(a), len(b))} examples, {shorter.name} "
            f"{min(len(a), len(b))}: the methods pair them line by line", longer.span(extra, extra + 1),
            notes=(Note(f"the first example without a partner in {shorter.name}"),),
            help="give both files the same number of lines, or use JSONL pairs")], sources)
    pairs = tuple(Pair(x, y, spans={"positive": xs, "negative": ys}) for (x, xs), (y, ys) in zip(a, b))
    return Dataset(pairs, sha256_of(pos, neg), (pos.name, neg.name), _file_sha256s(pos, neg), sources)


def two_sets(pos: Source, neg: Source) -> tuple[list[str], list[str], str]:
    """Two example sets of any sizes (for ``--calibrate``), and the sha256 of the files' bytes."""
    a, b = _both(pos, neg)
    return [x for x, _ in a], [y for y, _ in b], sha256_of(pos, neg)


def _both(pos: Source, neg: Source) -> tuple[list, list]:
    problems, sources, out = [], {}, []
    for src in (pos, neg):
        try:
            out.append(lines_at(src))
        except DataError as exc:
            problems.extend(exc.diagnostics)
            sources.update(exc.sources)
            out.append([])
    if problems:
        raise DataError(problems, sources)
    return out[0], out[1]


def _bytes(src: Source) -> bytes:
    # read_source decodes strictly and keeps everything (a BOM, CR LF), so this is the file's bytes exactly;
    # for pairs given in memory, the bytes of the JSONL text they are checked as.
    return src.text.encode("utf-8")


def sha256_of(*sources: Source) -> str:
    """The sha256 of the files' bytes, one after the other."""
    digest = hashlib.sha256()
    for src in sources:
        digest.update(_bytes(src))
    return digest.hexdigest()


def _file_sha256s(*sources: Source) -> tuple[str, ...]:
    return tuple(hashlib.sha256(_bytes(src)).hexdigest() for src in sources)
