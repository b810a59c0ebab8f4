"""Fuzzing the command line's inputs (steer.toml contents, globs over link loops, line ends by every path a
program comes) and the language server's wire (frames, renames).

Each input runs through the real entry points: ``steerc check`` in-process (``support.run_cli``), the API,
and a real ``steerc lsp`` process over its standard input and output.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from fuzzing import RAN, fuzz
from hypothesis import given
from hypothesis import strategies as st
from lsp_client import REPO, Client
from scaling import assert_cheap, unit_cost
from strategies import commented, programs
from support import run_cli

from steerc.frontend.fmt import format_program

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ------------------------------------------------------------------ line ends


def _positions(diagnostics: list[dict], name: str) -> list[tuple]:
    """(code, line, column, end line, end column) of each JSON diagnostic in the file ``name``."""
    return sorted((d["code"], d["line"], d["column"], d["end_line"], d["end_column"])
                  for d in diagnostics if d["file"] == name)


def _api_positions(result) -> list[tuple]:
    return sorted((d.code, d.span.line, d.span.column, d.span.end_line, d.span.end_column)
                  for d in result.diagnostics if d.span is not None and d.span.file == result.source.name)


def _lsp_positions(items: list[dict]) -> list[tuple]:
    """LSP diagnostics (utf-32: code points, as steerc counts columns) as 1-based positions."""
    return sorted((d["code"], d["range"]["start"]["line"] + 1, d["range"]["start"]["character"] + 1,
                   d["range"]["end"]["line"] + 1, d["range"]["end"]["character"] + 1) for d in items)


def _check_stdin(stdin) -> list[tuple]:
    old = sys.stdin
    sys.stdin = stdin
    try:
        code, out, err = run_cli(["check", "--format", "json", "-"])
    finally:
        sys.stdin = old
    assert "Traceback" not in err, err
    return _positions(json.loads(out)["diagnostics"], "<stdin>")


_ENDS = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _line_ended(draw) -> bytes:
    """A random program (comments added, and often a duplicate name behind a comment), its lines ended with
    random ``\\n``, ``\\r\\n`` and ``\\r``, sometimes after a byte-order mark."""
    text, _ = draw(commented(format_program(draw(programs(max_statements=5, with_constraint=False)))))
    if draw(st.booleans()):  # one file, two programs: `# note\rparam a = 2` was inside a comment on stdin
        text += "param dup = 1 # note\nparam dup = 2\n"
    lines = text.split("\n")
    out = lines[0]
    for line in lines[1:]:
        out += draw(_ENDS) + line
    data = out.encode("utf-8")
    return (b"\xef\xbb\xbf" + data) if draw(st.integers(0, 3)) == 0 else data


@pytest.fixture(scope="module")
def lsp_utf32(tmp_path_factory):
    root = tmp_path_factory.mktemp("ends")
    client = Client(cwd=str(root))
    client.initialize(encodings=["utf-32"], root=str(root))
    yield client, root
    client.kill()


def test_the_same_bytes_are_the_same_program_by_every_path(tmp_path, monkeypatch, lsp_utf32):
    """A file, standard input (its bytes, and a text stream), the API (check_file and check_source) and the
    language server give the same diagnostics, at the same places, for the same bytes."""
    from steerc.api import check_file, check_source

    client, root = lsp_utf32
    monkeypatch.chdir(root)
    path = root / "p.steer"
    count = [0]

    @fuzz(40, "line-ends")
    @given(_line_ended())
    def run(data):
        path.write_bytes(data)
        code, out, err = run_cli(["check", "--format", "json", str(path)])
        assert "Traceback" not in err, err
        by_file = _positions(json.loads(out)["diagnostics"], str(path))
        stdin_bytes = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")  # sys.stdin: text over bytes
        assert _check_stdin(stdin_bytes) == by_file
        assert _check_stdin(io.StringIO(data.decode("utf-8"))) == by_file  # a text-only stream
        assert _api_positions(check_file(str(path))) == by_file
        text = data.decode("utf-8-sig")  # what an editor holds: the mark dropped, the line ends kept
        assert _api_positions(check_source(text, str(path))) == by_file
        count[0] += 1
        uri = (root / f"d{count[0]}.steer").as_uri()
        client.open(uri, text)
        assert _lsp_positions(client.diagnostics(uri, 1)) == by_file
        client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        RAN["line-ends"] += 1

    run()


@st.composite
def _bytes_edited(draw) -> tuple[bytes, int | None]:
    """A random program's bytes with random bytes put in, and where the first that is not UTF-8 is (None
    when the result is UTF-8 after all)."""
    data = bytearray(draw(_line_ended()))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=3))
    data = bytes(data)
    try:
        data.decode("utf-8-sig")
        return data, None
    except UnicodeDecodeError as exc:
        return data, exc.start


def test_bytes_that_are_not_utf8_are_a_diagnostic_on_every_path(tmp_path, monkeypatch):
    """Whatever bytes a file holds, check (a file, standard input's bytes) and check_file answer with
    diagnostics; bytes that are not UTF-8 give invalid-encoding, the same at the same place by every path."""
    from steerc.api import check_file

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "p.steer"

    @fuzz(60, "bytes")
    @given(_bytes_edited())
    def run(case):
        data, bad = case
        path.write_bytes(data)
        code, out, err = run_cli(["check", "--format", "json", str(path)])
        assert code in (0, 1) and "Traceback" not in err, err
        by_file = _positions(json.loads(out)["diagnostics"], str(path))
        assert _check_stdin(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")) == by_file
        assert _api_positions(check_file(str(path))) == by_file
        codes = [d["code"] for d in json.loads(out)["diagnostics"]]
        assert (codes == ["invalid-encoding"]) == (bad is not None), codes
        RAN["bytes"] += 1

    run()


def test_a_lone_cr_ends_a_line_on_real_standard_input(tmp_path):
    """The bytes path of a real process: `check -` and `check FILE` agree on `# note\\rparam a = 2`."""
    data = b"steer 1\nparam a = 1 # note\rparam a = 2\n"
    (tmp_path / "p.steer").write_bytes(data)
    env = dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1")
    runs = [subprocess.run([sys.executable, "-m", "steerc", "check", "--format", "json", *argv], input=data,
                           cwd=str(tmp_path), env=env, capture_output=True, timeout=120) for argv in (["-"], ["p.steer"])]
    found = [[(d["code"], d["line"], d["column"]) for d in json.loads(r.stdout)["diagnostics"]] for r in runs]
    assert found[0] == found[1] and ("duplicate-name", 3, 7) in found[0], found
    parsed = subprocess.run([sys.executable, "-m", "steerc", "fmt", "-"], input=b"\xef\xbb\xbf" + data,
                            cwd=str(tmp_path), env=env, capture_output=True, timeout=120)
    assert parsed.returncode == 0 and parsed.stdout == b"steer 1\n\nparam a = 1  # note\nparam a = 2\n"


# ------------------------------------------------------------------ rename


def _renamed(node, old: str, new: str):
    """``node`` (IR) with the name ``old`` made ``new`` where it is declared and used."""
    from steerc.core import record
    from steerc.ir import nodes as ir

    if isinstance(node, tuple):
        return tuple(_renamed(n, old, new) for n in node)
    if not record.has(type(node)):
        return node
    changes = {f.name: _renamed(getattr(node, f.name), old, new) for f in record.fields(type(node))
               if f.eq and (record.has(type(getattr(node, f.name))) or isinstance(getattr(node, f.name), tuple))}
    if isinstance(node, ir.Name) and node.id == old:
        changes["id"] = new
    if type(node).__name__.endswith("Decl") and getattr(node, "name", None) == old:
        changes["name"] = new
    return record.evolve(node, **changes) if changes else node


def _applied(text: str, edits: list[dict]) -> str:
    """``text`` (``\\n`` line ends) with LSP edits (utf-32 positions) applied."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)

    def offset(p):
        return starts[p["line"]] + p["character"]

    for e in sorted(edits, key=lambda e: offset(e["range"]["start"]), reverse=True):
        a, b = offset(e["range"]["start"]), offset(e["range"]["end"])
        text = text[:a] + e["newText"] + text[b:]
    return text


def _meaning(result, old: str | None = None, new: str | None = None) -> list[tuple]:
    """The diagnostics as (code, line, message), ``old`` written ``new`` in messages."""
    out = []
    for d in result.diagnostics:
        message = d.message if old is None else d.message.replace(f"`{old}`", f"`{new}`")
        out.append((d.code, d.span.line if d.span else None, message))
    return sorted(out)


_NEW_NAMES = st.one_of(
    st.sampled_from(["ghost", "fresh", "x_2", "add", "norm", "true", "steer", "model", "param", "head", "load",
                     "normalize", "cosine", "resid_pre", "prompt", "token", "deg", "1a", "a-b", "", " ", "é",
                     "a" * 300]),
    st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True),
)


def test_an_accepted_rename_keeps_the_program_modulo_the_name(lsp_utf32):
    """Renaming `a` to a name used but undeclared captured that use. Whatever rename the server accepts, the IR
    after it is the IR before with the name mapped, and the diagnostics are the same modulo the name."""
    from steerc.api import check_source

    client, root = lsp_utf32
    count = [0]

    @fuzz(40, "lsp-rename")
    @given(programs(max_statements=6, with_constraint=False), st.data())
    def run(program, data):
        text = format_program(program)
        haunted = data.draw(st.booleans())
        if haunted:  # a use of a name nobody declares: `ghost` must not be captured
            text += "param haunted = ghost + 1\n"
        before = check_source(text, "p.steer")
        if before.program is None:
            return
        decls = [s for s in before.program.statements if type(s).__name__ in
                 ("ParamDecl", "VectorDecl", "ProbeDecl", "InterventionDecl") and s.name_span is not None]
        if not decls:
            decls = None
        names = [s.name for s in decls or ()]
        choices = [_NEW_NAMES, *([st.sampled_from(names)] if names else []), *([st.just("ghost")] if haunted else [])]
        new = data.draw(st.one_of(choices))
        count[0] += 1
        uri = (root / f"r{count[0]}.steer").as_uri()
        client.open(uri, text)
        RAN["lsp-rename"] += 1
        if decls is None:
            client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
            return
        target = data.draw(st.sampled_from(decls))
        position = {"line": target.name_span.line - 1, "character": target.name_span.column - 1}
        try:
            answer = client.request("textDocument/rename", {"textDocument": {"uri": uri}, "position": position,
                                                            "newName": new})
        except Exception as exc:  # refused: with a reason
            assert getattr(exc, "code", None) == -32803 and exc.message, exc
            return
        finally:
            client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        if answer is None:
            assert new == target.name
            return
        after = check_source(_applied(text, answer["changes"][uri]), "p.steer")
        assert after.program is not None, new
        assert after.program == _renamed(before.program, target.name, new), (target.name, new)
        assert _meaning(after) == _meaning(before, target.name, new), (target.name, new)

    run()


# ------------------------------------------------------------------ steer.toml on the command line

_TOML_PIECES = st.sampled_from([
    "[defaults]", "[params]", "[x]", "model", "target", '"vllm"', '"hf"', "=", " = ", " ", "\n", "\r\n", '"', "'",
    "#", "[", "]", "{", "}", ",", ".", "1", "-", "+", "e", "1e39", "3.4e38", "nan", "inf", "true", "0x1f",
    "1_000", "strength", "a", "9" * 40, "9" * 401, "9" * 5001, "1" * 99, "é", "1979-05-27", '"""', "\\",
])


def test_no_steer_toml_makes_the_command_line_fail(tmp_path, monkeypatch):
    """Whatever steer.toml holds, `check` (text and JSON) and `compile` answer with diagnostics inside it."""
    (tmp_path / "p.steer").write_text("steer 1\nparam strength = 1\nparam a = 2\n")
    monkeypatch.chdir(tmp_path)

    values = st.one_of(st.lists(_TOML_PIECES, min_size=1, max_size=4).map("".join),
                       st.integers(0, 6000).map(lambda n: "-" * (n % 2) + "9" * n), st.floats().map(repr))
    structured = st.builds(lambda table, key, value: f"{table}\n{key} = {value}\n",
                           st.sampled_from(["[params]", "[defaults]", "[x]"]),
                           st.sampled_from(["strength", "a", "model", "target", "1"]), values)

    @fuzz(60, "cli-steer-toml")
    @given(st.one_of(st.lists(_TOML_PIECES, max_size=30).map("".join), structured),
           st.sampled_from(["text", "json", "compile"]))
    def run(toml, how):
        (tmp_path / "steer.toml").write_text(toml, encoding="utf-8", newline="")
        argv = (["compile", "p.steer", "--target", "vllm", "-o", str(tmp_path / "out")] if how == "compile"
                else ["check", "--format", how, "p.steer"])
        code, out, err = run_cli(argv)
        assert "Traceback" not in err + out and code in (0, 1, 2), err[-2000:]
        if how == "json":
            for d in json.loads(out)["diagnostics"]:
                if d["file"] == "steer.toml":
                    assert d["code"] in ("invalid-config", "limit-exceeded") and d["line"] >= 1
        RAN["cli-steer-toml"] += 1

    run()


# ------------------------------------------------------------------ globs over link loops


def test_globs_over_link_loops_end_fast(tmp_path, monkeypatch):
    # A pattern of at most 45 parts climbs at most 45 directories ("..", or "up" and "*" through the links), so
    # the tree sits 50 empty directories down: every climb stays inside tmp_path, and never walks the suite's
    # other temporary directories (a CI run once spent 2.5 s checking them through "p/../..").
    root = tmp_path.joinpath(*(f"d{i}" for i in range(50)))
    (root / "p" / "q").mkdir(parents=True)
    (root / "p" / "x.steer").write_text("steer 1\n")
    (root / "p" / "q" / "y.steer").write_text("steer 1\n")
    for name, to in (("l1", "."), ("l2", "."), ("up", ".."), ("q/back", "..")):
        os.symlink(to, root / "p" / name)
    monkeypatch.chdir(root)
    parts = st.sampled_from(["*", "**", "?", "l1", "l2", "up", "q", "back", "[lq]*", "*.steer", "x.steer", ".*",
                             "..", "."])

    for warm in (["check", "p/x.steer"], ["fmt", "--check", "p/x.steer"]):  # one-time imports are not the glob's
        run_cli(warm)
    ordinary = {"check": unit_cost(lambda: run_cli(["check", "p/x.steer"])),  # the file named without a pattern
                "fmt": unit_cost(lambda: run_cli(["fmt", "--check", "p/x.steer"]))}

    @fuzz(60, "cli-glob-loops")
    @given(st.lists(parts, min_size=1, max_size=45).map(lambda ps: "p/" + "/".join(ps)),
           st.sampled_from(["check", "fmt"]))
    def run(pattern, command):
        argv = [command, "--check", pattern] if command == "fmt" else [command, pattern]
        code, out, err = assert_cheap(lambda: run_cli(argv), ordinary[command], 50, pattern)  # CPU: the glob's own
        assert "Traceback" not in err and code in (0, 1, 2), err[-2000:]
        RAN["cli-glob-loops"] += 1

    run()


# ------------------------------------------------------------------ LSP frames

_LENGTHS = st.one_of(st.integers(0, 300).map(str), st.sampled_from(["-1", "abc", "", "1e3", " 12", "0x10"]))
_BODIES = st.sampled_from([b'{"jsonrpc": "2.0", "id": "g", "method": "steerc/x"}', b"not json", b"\xff\xfe\x00",
                           b"{", b"[" * 50_000, b"", b'{"jsonrpc": "2.0", "method": "textDocument/didOpen"}',
                           b"Content-Length: 5\r\n", b"\r\n\r\n", "é😀".encode()])


@st.composite
def _garbage(draw) -> bytes:
    """Frames with random headers, lengths, line ends and bodies, and raw bytes between them."""
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["frame", "frame", "raw"]))
        if kind == "raw":
            out += draw(st.binary(max_size=40))
            continue
        name = draw(st.sampled_from([b"Content-Length", b"content-length", b"Content-Type", b"X", b""]))
        sep = draw(st.sampled_from([b": ", b":", b" : ", b""]))
        end = draw(st.sampled_from([b"\r\n", b"\n", b"\r", b""]))
        body = draw(_BODIES)
        length = draw(st.one_of(st.just(str(len(body))), _LENGTHS)).encode()
        extra = draw(st.sampled_from([b"", b"Content-Type: application/json\r\n", b"bad header\r\n"]))
        out += extra + name + sep + length + end + draw(st.sampled_from([b"\r\n", b"\n", b""])) + body
    return out


def test_any_frames_then_a_good_request_are_answered(tmp_path):
    """After any bytes, the server answers a well-formed request (or has exited with a message); never hangs.
    A wrong length may swallow the frames after it (up to 300 bytes here): a burst of requests outlasts it."""
    import time

    state = {"client": None, "id": 0}

    def client():
        if state["client"] is None or state["client"].proc.poll() is not None:
            state["client"] = Client(cwd=str(tmp_path))
            state["client"].initialize()
        return state["client"]

    @fuzz(30, "lsp-frames")
    @given(_garbage(), st.booleans())
    def run(garbage, huge):
        c = client()
        if huge:  # a frame too long to read
            garbage += b"Content-Length: %d\r\n\r\n{}" % (10**12)
        c.proc.stdin.write(garbage)
        ids = []
        for _ in range(8):
            state["id"] += 1
            ids.append(state["id"])
            body = json.dumps({"jsonrpc": "2.0", "id": state["id"], "method": "steerc/ping"}).encode()
            c.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        c.proc.stdin.flush()
        deadline = time.monotonic() + 15
        while not any(i in c.responses for i in ids):
            if c.proc.poll() is not None:
                assert huge and "longer than the limit" in c.log(), c.log()
                break
            assert time.monotonic() < deadline, f"no answer after {garbage!r}\n{c.log()}"
            try:
                c._pump(0.05)
            except EOFError:
                pass
        else:
            assert not huge or c.proc.poll() is None
        c.responses.clear()
        RAN["lsp-frames"] += 1

    try:
        run()
    finally:
        if state["client"] is not None:
            state["client"].kill()
