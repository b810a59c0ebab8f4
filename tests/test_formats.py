"""``steerc check --format sarif|github``: valid SARIF 2.1.0, annotations the Actions runner reads back exactly.

The SARIF logs are validated against the OASIS schema vendored in
``tests/schemas`` (see its README for where it came from). The annotations
are parsed back the way ``actions/runner`` does (``ActionCommand.cs``:
split at ``::``, properties at ``,`` and the first ``=``, each escape
mapping undone in order, ``%25`` last) and compared with the JSON form.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse

import pytest
from support import GOLDEN, compare_golden, run_cli

SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas", "sarif-schema-2.1.0.json")
URI = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*\Z")  # RFC 3986 characters only


@pytest.fixture(scope="session")
def sarif_valid():
    import jsonschema

    with open(SCHEMA, encoding="utf-8") as fh:
        validator = jsonschema.Draft4Validator(json.load(fh))

    def check(doc: dict) -> dict:
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])
        for uri in _uris(doc):  # the schema says `format: uri`, which jsonschema checks only with extra packages
            assert URI.match(uri), uri
        run = doc["runs"][0]
        rules = run["tool"]["driver"]["rules"]
        for r in run["results"]:
            assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
            for place in r.get("locations", []) + r.get("relatedLocations", []):
                region = place["physicalLocation"]["region"]
                assert (region["endLine"], region["endColumn"]) >= (region["startLine"], region["startColumn"])
        return doc

    return check


def _uris(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("uri", "helpUri", "informationUri", "$schema") and isinstance(v, str):
                yield v
            else:
                yield from _uris(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _uris(v)


# The runner's unescaping (actions/runner, src/Runner.Worker/ActionCommand.cs).
DATA_MAPPINGS = (("\r", "%0D"), ("\n", "%0A"), ("%", "%25"))
PROPERTY_MAPPINGS = (("\r", "%0D"), ("\n", "%0A"), (":", "%3A"), (",", "%2C"), ("%", "%25"))


def _unescape(text: str, mappings) -> str:
    for token, replacement in mappings:
        text = text.replace(replacement, token)
    return text


def parse_command(line: str) -> tuple[str, dict[str, str], str]:
    """(command, properties, message) of one workflow command, as the runner reads it."""
    assert line.startswith("::")
    head, sep, data = line[2:].partition("::")
    assert sep
    command, _, props = head.partition(" ")
    properties = {}
    for pair in filter(None, props.split(",")):
        key, _, value = pair.partition("=")
        properties[key] = _unescape(value, PROPERTY_MAPPINGS)
    return command, properties, _unescape(data, DATA_MAPPINGS)


def formats(argv: list[str], stdin: str | None = None) -> tuple[int, dict, dict, list[str]]:
    """(exit code, the JSON document, the SARIF log, the annotation lines) of one ``check``."""
    outs = {}
    codes = set()
    for fmt in ("json", "sarif", "github"):
        code, out, err = run_cli(["check", "--format", fmt, *argv], stdin=stdin)
        assert "Traceback" not in err, err
        codes.add(code)
        outs[fmt] = out
    assert len(codes) == 1, codes
    lines = outs["github"].splitlines()
    assert re.match(r"\d+ files? checked: ", lines[-1]), lines[-1]
    return codes.pop(), json.loads(outs["json"]), json.loads(outs["sarif"]), lines[:-1]


# ------------------------------------------------------------ the shared bad examples


def test_the_bad_examples_as_sarif_and_annotations(examples_dir, monkeypatch, sarif_valid, update_golden):
    monkeypatch.chdir(examples_dir)
    code, doc, log, lines = formats(["bad"])
    assert code == 1
    sarif_valid(log)
    run = log["runs"][0]
    assert log["version"] == "2.1.0" and len(log["runs"]) == 1
    assert run["columnKind"] == "utf16CodeUnits" and run["tool"]["driver"]["name"] == "steerc"
    results = run["results"]
    assert len(results) == len(lines) == len(doc["diagnostics"]) > 10
    for d, result, line in zip(doc["diagnostics"], results, lines):
        assert result["ruleId"] == d["code"] and result["level"] == d["severity"]
        assert result["message"]["text"].split("\n")[0] == d["message"]
        place = result["locations"][0]["physicalLocation"]
        assert place["artifactLocation"] == {"uri": urllib.parse.quote(d["file"]), "uriBaseId": "%SRCROOT%"}
        assert place["region"] == {"startLine": d["line"], "startColumn": d["column"],  # all ASCII
                                   "endLine": d["end_line"], "endColumn": d["end_column"]}
        command, props, message = parse_command(line)
        assert command == d["severity"] and props["title"] == d["code"] and props["file"] == d["file"]
        assert (int(props["line"]), int(props["endLine"])) == (d["line"], d["end_line"])
        assert message.split("\n")[0] == d["message"]
        assert f"help: {d['help']}" in message.split("\n") if "help" in d else "help: " not in message
        for note in d.get("notes", []):
            assert any(n["message"]["text"] == note["message"] for n in result.get("relatedLocations", [])) \
                or f"note: {note['message']}" in message
    base = run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
    assert base.startswith("file:///") and base.endswith("/")
    # The golden file holds the results (the rules and their indexes follow the registry, tested above).
    # Some helps name the examples folder; the golden files hold it as <examples>, wherever it lies.
    shown = [{k: v for k, v in r.items() if k != "ruleIndex"} for r in results]
    here = os.path.realpath(examples_dir)
    compare_golden(os.path.join(GOLDEN, "formats", "bad.sarif-results.json"),
                   json.dumps(shown, indent=2, ensure_ascii=False).replace(here, "<examples>") + "\n",
                   update_golden)
    compare_golden(os.path.join(GOLDEN, "formats", "bad.github.txt"),
                   "\n".join(lines).replace(here, "<examples>") + "\n", update_golden)


def test_output_is_byte_for_byte_the_same_each_run(examples_dir, monkeypatch):
    monkeypatch.chdir(examples_dir)
    for fmt in ("sarif", "github"):
        runs = {run_cli(["check", "--format", fmt, ".", "--model", "models/tiny-llama"])[1] for _ in range(2)}
        assert len(runs) == 1


def test_every_code_is_a_rule_with_its_registry_metadata(examples_dir, monkeypatch, sarif_valid):
    from steerc.diagnostics.codes import CODES

    monkeypatch.chdir(examples_dir)
    monkeypatch.delenv("STEERC_DOCS_URL", raising=False)
    plain = sarif_valid(json.loads(run_cli(["check", "--format", "sarif", "01_add.steer"])[1]))
    driver = plain["runs"][0]["tool"]["driver"]
    assert "informationUri" not in driver and all("helpUri" not in r for r in driver["rules"])
    home = "https://example.org/steerc"
    monkeypatch.setenv("STEERC_DOCS_URL", home + "/")
    log = sarif_valid(json.loads(run_cli(["check", "--format", "sarif", "01_add.steer"])[1]))
    assert log["runs"][0]["tool"]["driver"]["informationUri"] == home
    assert log["runs"][0]["results"] == []
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(CODES)
    for rule in rules:
        code = CODES[rule["id"]]
        assert rule["shortDescription"]["text"] == code.summary
        assert rule["defaultConfiguration"]["level"] == code.severity
        assert rule["helpUri"] == f"{home}/blob/main/spec/diagnostics.md#{code.name}"


# ------------------------------------------------- every kind of place a diagnostic has


@pytest.fixture
def places(tmp_path, monkeypatch, examples_dir):
    """A project whose steer.toml, model config, schema, command line and standard input all get diagnostics."""
    import shutil

    shutil.copytree(os.path.join(examples_dir, "models", "tiny-llama"), tmp_path / "models" / "m")
    config = json.loads((tmp_path / "models" / "m" / "config.json").read_text())
    del config["model_type"]
    (tmp_path / "models" / "m" / "config.json").write_text(json.dumps({"model_type": "mamba", **config}, indent=1))
    (tmp_path / "steer.toml").write_text('[defaults]\nmodel = "models/m"\ncolour = "blue"\n')
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "s.json").write_text('{"type": "object",\n "properties": {"é😀": {"type": "strin"}}}\n',
                                          encoding="utf-8")
    (tmp_path / "c.steer").write_text('steer 1\n\nconstrain json_schema from "s/s.json"\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_each_place_maps_to_a_location_or_into_the_message(places, sarif_valid):
    pytest.importorskip("steerc.constraints")
    stdin = "steer 1\n\nvector v = [1.0] * w\n"
    code, doc, log, lines = formats(["-", "c.steer", "--set", "nope=1"], stdin=stdin)
    assert code == 1
    sarif_valid(log)
    results = log["runs"][0]["results"]
    got = [(r["ruleId"], _where(r)) for r in results]
    assert got == [
        ("invalid-config", ("steer.toml", 3, 1, 3, 7)),
        ("unknown-family", ("models/m/config.json", 2, 16, 2, 23)),
        ("undefined-name", None),  # `--set nope=1`, for <stdin>
        ("undefined-name", None),  # `w`, in <stdin>
        ("undefined-name", None),  # `--set nope=1`, for c.steer
        ("invalid-constraint", ("c.steer", 3, 1, 3, 38)),
    ], got
    text = [r["message"]["text"] for r in results]
    assert text[2].startswith("`--set nope=...` names no param of this program (at <command line>:1:")
    assert text[3].startswith("undefined name `w` (at <stdin>:3:20)")
    # the schema's note: a related location, its column in UTF-16 code units (é is one, 😀 two)
    (related,) = results[5]["relatedLocations"]
    assert _where(related) == ("s/s.json", 2, 33, 2, 40) and related["message"]["text"] == "here"
    json_note = doc["diagnostics"][5]["notes"][0]
    assert (json_note["column"], json_note["end_column"]) == (32, 39)  # characters, as in the text form
    parsed = [parse_command(line) for line in lines]
    assert [(p[1].get("file"), p[1].get("line"), p[1].get("col")) for p in parsed] == [
        ("steer.toml", "3", "1"), ("models/m/config.json", "2", "16"),
        (None, None, None), (None, None, None), (None, None, None), ("c.steer", "3", "1")]
    assert "note: here (at s/s.json:2:32)" in parsed[5][2].split("\n")


def _where(obj):
    if "locations" not in obj and "physicalLocation" not in obj:
        return None
    place = (obj["locations"][0] if "locations" in obj else obj)["physicalLocation"]
    r = place["region"]
    return place["artifactLocation"]["uri"], r["startLine"], r["startColumn"], r["endLine"], r["endColumn"]


def test_a_file_outside_the_working_directory_is_a_file_uri(examples_dir, tmp_path, monkeypatch, sarif_valid):
    monkeypatch.chdir(tmp_path)
    program = os.path.join(examples_dir, "bad", "version.steer")
    log = sarif_valid(json.loads(run_cli(["check", "--format", "sarif", program])[1]))
    (result,) = log["runs"][0]["results"]
    artifact = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact == {"uri": "file://" + urllib.parse.quote(os.path.realpath(program))} or \
        artifact == {"uri": "file://" + urllib.parse.quote(program)}


# ---------------------------------------------------------------- columns and unicode


@pytest.mark.parametrize("prefix, units", [
    ("", 0), ("é", 1), ("😀", 2), ("e\u0301", 2), ("日本", 2), ("\t", 1), ("𝔘𝔫", 4), ("ä😀日", 4),
])
def test_sarif_columns_count_utf16_units(prefix, units, tmp_path, monkeypatch, sarif_valid):
    """`w` is undefined after a string holding ``prefix``: its SARIF column counts UTF-16 code units."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "u.steer").write_text(f'steer 1\n\nvector v = load("{prefix}.npy") * w\n', encoding="utf-8")
    code, doc, log, lines = formats(["u.steer"])
    (d,) = doc["diagnostics"]
    (result,) = sarif_valid(log)["runs"][0]["results"]
    chars = 'vector v = load("'.__len__() + len(prefix) + '.npy") * '.__len__() + 1
    assert (d["column"], d["end_column"]) == (chars, chars + 1)
    assert _where(result)[1:] == (3, chars - len(prefix) + units, 3, chars - len(prefix) + units + 1)
    _, props, _ = parse_command(lines[0])
    assert (props["col"], props["endColumn"]) == (str(chars), str(chars + 1))  # annotations: characters


def test_utf16_column_helper():
    from steerc.core.source import Source
    from steerc.diagnostics.places import utf16_column

    src = Source("a", "a😀b\n\ud800x\n")
    assert [utf16_column(src, 1, c) for c in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 5, 6, 7]  # past the end: +1 a column
    assert utf16_column(src, 2, 2) == 2  # a lone surrogate is one unit
    assert utf16_column(None, 1, 9) == 9


# ------------------------------------------------------------------ hostile text


def test_hostile_paths_and_messages_survive_the_runner(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "we,ird:na%me\n.steer"
    (tmp_path / name).write_text('steer 1\n\nvector v = load("50%\\r\\n::error file=x,line=1::pwned.npy")\n')
    code, out, _ = run_cli(["check", "--format", "github", name])
    assert code == 1
    line, summary = out.splitlines()
    command, props, message = parse_command(line)
    assert command == "error" and props["title"] == "file-not-found"
    assert props["file"] == name and (props["line"], props["col"]) == ("3", "17")
    assert message.startswith("vector file `50%\r\n::error file=x,line=1::pwned.npy` does not exist\nhelp: ")
    assert summary == "1 file checked: 1 error, 0 warnings"


def test_escaping_is_that_of_actions_core():
    """The vectors of ``packages/core/__tests__/command.test.ts`` in actions/toolkit."""
    from steerc.diagnostics.github import escape_data, escape_property

    assert escape_data("percent % percent % cr \r cr \r lf \n lf \n") == \
        "percent %25 percent %25 cr %0D cr %0D lf %0A lf %0A"
    assert escape_data("%25 %25 %0D %0D %0A %0A") == "%2525 %2525 %250D %250D %250A %250A"
    assert escape_property("percent % percent % cr \r cr \r lf \n lf \n colon : colon : comma , comma ,") == \
        "percent %25 percent %25 cr %0D cr %0D lf %0A lf %0A colon %3A colon %3A comma %2C comma %2C"
    assert escape_data("%25 %25 %0D %0D %0A %0A %3A %3A %2C %2C") == \
        "%2525 %2525 %250D %250D %250A %250A %253A %253A %252C %252C"


def test_a_bracketed_link_in_a_message_is_escaped_in_sarif(sarif_valid):
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.sarif import to_sarif

    plain = Diagnostic.error("file-not-found", "vector file `x[0].npy` does not exist", None)
    link = Diagnostic.error("file-not-found", "vector file `[a](1)\\.npy` does not exist", None)
    log = sarif_valid(to_sarif([(plain, {}), (link, {})], cwd="/"))
    texts = [r["message"]["text"] for r in log["runs"][0]["results"]]
    assert texts == ["vector file `x[0].npy` does not exist", "vector file `\\[a\\](1)\\\\.npy` does not exist"]


def test_a_diagnostic_without_a_place_and_one_over_several_lines():
    from steerc.core.source import Source
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.github import workflow_command

    assert workflow_command(Diagnostic.error("undefined-name", "x", None), {}) == "::error title=undefined-name::x"
    src = Source("p.steer", "steer 1\nintervention a {\n}\n", "/w/p.steer")
    d = Diagnostic.warning("no-effect", "does nothing", src.span(8, 26))
    assert workflow_command(d, {src.name: src}, cwd="/w") == \
        "::warning title=no-effect,file=p.steer,line=2,endLine=3::does nothing"


# ------------------------------------------------------------------ the spec's examples


def _spec(name: str) -> str:
    with open(os.path.join(os.path.dirname(SCHEMA), "..", "..", "spec", name), encoding="utf-8") as fh:
        return fh.read()


def test_the_spec_shows_what_steerc_prints(examples_dir, monkeypatch):
    """spec/formats.md: its annotations example, and its SARIF result, are steerc's output for them."""
    import shlex

    text = _spec("formats.md")
    (block,) = re.findall(r"^```text\n\$ (steerc check --format github .*?)^```$", text, re.S | re.M)
    command, _, expected = block.partition("\n")
    monkeypatch.chdir(examples_dir)
    assert run_cli(shlex.split(command)[1:])[1] == expected
    (shown,) = [json.loads(b) for b in re.findall(r"^```json\n(.*?)^```$", text, re.S | re.M)]
    log = json.loads(run_cli(["check", "--format", "sarif", "bad/undefined_vector.steer"])[1])
    assert shown in log["runs"][0]["results"]
