"""``steerc check`` on folders and globs: which files, in which order, each with its own project root."""

from __future__ import annotations

import json
import os

import pytest
from scaling import assert_cheap, unit_cost
from support import run_cli

CLEAN = "steer 1\n\nvector v = [1.0, 0.0, 0.0, 0.0]\n\nintervention push {\n  at  resid_pre[0]\n  add 2 * v\n}\n"
BROKEN = "steer 1\n\nintervention push {\n  at  resid_pre[0]\n  add 2 * w\n}\n"


def write(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def checked(argv: list[str]) -> tuple[int, list[str]]:
    code, out, err = run_cli(["check", "--format", "json", *argv])
    assert "Traceback" not in err
    return code, json.loads(out)["files"] if out else []


@pytest.fixture
def tree(tmp_path, monkeypatch):
    write(tmp_path, {
        "b.steer": CLEAN,
        "a/z.steer": CLEAN,
        "a/b-c/y.steer": CLEAN,
        "a/notes.txt": "not a program",
        "a/.hidden.steer": BROKEN,
        ".git/x.steer": BROKEN,
        ".venv/lib/x.steer": BROKEN,
        "venv/pyvenv.cfg": "home = /usr\n",
        "venv/lib/x.steer": BROKEN,
        "node_modules/pkg/x.steer": BROKEN,
        "a/__pycache__/x.steer": BROKEN,
    })
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_folder_is_its_steer_files_sorted_by_path(tree):
    assert checked(["."]) == (0, ["a/b-c/y.steer", "a/z.steer", "b.steer"])
    assert checked(["a"]) == (0, ["a/b-c/y.steer", "a/z.steer"])
    assert checked([str(tree / "a")])[1] == [str(tree / "a" / "b-c" / "y.steer"), str(tree / "a" / "z.steer")]


def test_a_glob_is_expanded_by_steerc(tree):
    assert checked(["**/*.steer"]) == (0, ["a/b-c/y.steer", "a/z.steer", "b.steer"])
    assert checked(["a/*.steer"]) == (0, ["a/z.steer"])
    assert checked(["?.steer"]) == (0, ["b.steer"])


def test_a_glob_names_skipped_folders_only_outright(tree):
    """A wildcard does not enter node_modules or a virtual environment; a pattern naming one does."""
    code, files = checked(["node_modules/*/x.steer"])
    assert (code, files) == (1, ["node_modules/pkg/x.steer"])
    code, files = checked(["venv/**/*.steer"])
    assert (code, files) == (1, ["venv/lib/x.steer"])


def test_an_explicit_file_is_checked_whatever_its_name_or_folder(tree):
    code, files = checked([".git/x.steer", "a/notes.txt"])
    assert code == 1 and files == [".git/x.steer", "a/notes.txt"]


def test_each_file_is_checked_once_where_it_first_appears(tree):
    assert checked(["b.steer", ".", "a/z.steer", "*.steer"])[1] == ["b.steer", "a/b-c/y.steer", "a/z.steer"]


@pytest.mark.parametrize("argv, fragment", [
    (["a/b-c/empty"], "no .steer files in the folder a/b-c/empty"),
    (["nothing/**/*.steer"], "no file matches the glob 'nothing/**/*.steer'"),
    (["b.steer", "*.stear"], "no file matches the glob '*.stear'"),
])
def test_an_empty_folder_or_glob_is_a_usage_error(tree, argv, fragment):
    (tree / "a" / "b-c" / "empty").mkdir()
    code, out, err = run_cli(["check", *argv])
    assert code == 2 and out == ""
    assert fragment in err and "Traceback" not in err


def test_the_exit_code_is_the_worst_file(tree):
    write(tree, {"c/broken.steer": BROKEN})
    code, out, _ = run_cli(["check", "a", "c"])
    assert code == 1
    assert "error[undefined-name]" in out and out.rstrip().endswith("3 files checked: 1 error, 0 warnings")


def test_each_file_has_the_root_of_its_own_steer_toml(tmp_path, monkeypatch):
    """A folder of two projects: the same program text loads `../v.npy` inside one root and outside the other."""
    import numpy as np

    program = ('steer 1\n\nvector v = load("../v.npy")\n\nintervention push {\n  at  resid_pre[0]\n'
               '  add 2 * v\n}\n')
    write(tmp_path, {"one/steer.toml": "", "one/p/prog.steer": program,
                     "two/p/steer.toml": "", "two/p/prog.steer": program})
    for folder in ("one", "two/p/.."):
        np.save(tmp_path / folder / "v.npy", np.ones(4, dtype=np.float32))
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["check", "--format", "json", "."])
    doc = json.loads(out)
    assert code == 1 and doc["files"] == ["one/p/prog.steer", "two/p/prog.steer"]
    assert [(d["file"], d["code"]) for d in doc["diagnostics"]] == [("two/p/prog.steer", "path-escape")]
    code, out, _ = run_cli(["check", "--format", "json", ".", "--root", "."])  # one root for both
    assert code == 0, out
    code, out, _ = run_cli(["check", "--format", "json", ".", "--root", "two"])
    assert [d["file"] for d in json.loads(out)["diagnostics"]] == ["one/p/prog.steer"]


def test_a_folder_walk_does_not_follow_links_to_folders(tree):
    os.symlink(tree / "a", tree / "link")
    assert checked(["."])[1] == ["a/b-c/y.steer", "a/z.steer", "b.steer"]


@pytest.fixture
def loops(tmp_path, monkeypatch):
    """A folder holding two links to itself (and one through its parent): `**` and `*/*/...` would name 2^40
    paths through them."""
    write(tmp_path, {"p/x.steer": CLEAN})
    os.symlink(".", tmp_path / "p" / "l1")
    os.symlink(".", tmp_path / "p" / "l2")
    os.symlink("../p", tmp_path / "p" / "up")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("pattern", ["p/**/*.steer", "**/*.steer", "p/**/**/**/x.steer", "p/" + "*/" * 39 + "*.steer",
                                     "p/" + "**/*/" * 19 + "x.steer", "p/" + "*/" * 400 + "*.steer",
                                     "p/*/" * 400 + "*.steer"])
@pytest.mark.parametrize("command", ["check", "fmt"])
def test_a_glob_through_link_loops_finishes_fast(loops, pattern, command):
    """glob.glob took 72 s and then died of a MemoryError on `p/**/*.steer` here."""
    flags = ["--format", "json"] if command == "check" else ["--check"]
    ordinary = unit_cost(lambda: run_cli([command, *flags, "p/x.steer"]))  # the file named without a pattern
    code, out, err = assert_cheap(lambda: run_cli([command, *flags, pattern]), ordinary, 50, pattern[:80])
    assert "Traceback" not in err, err[-300:]
    if pattern.count("/") > 40:  # Linux follows at most 40 links in one path: nothing that deep exists
        assert code == 2 and "no file matches the glob" in err
        return
    assert code == 0, err
    if command == "check":
        (name,) = json.loads(out)["files"]  # the one file, once, whichever way it was reached
        assert os.path.basename(name) == "x.steer" and os.path.samefile(name, loops / "p" / "x.steer")


def test_a_glob_past_the_limit_is_limit_exceeded_at_the_argument(tree, monkeypatch):
    import steerc.cli.inputs as inputs

    monkeypatch.setattr(inputs, "MAX_GLOB_PATHS", 5)
    code, out, err = run_cli(["check", "--format", "json", "b.steer", "**/*.steer"])
    assert code == 1 and "Traceback" not in err, err
    (d,) = json.loads(out)["diagnostics"]
    assert d["code"] == "limit-exceeded" and "more than 5 folder entries" in d["message"]
    assert d["file"] == "<command line>" and (d["line"], d["column"], d["end_column"]) == (1, 36, 48)
    code, out, err = run_cli(["check", "**/*.steer"])
    assert code == 1 and "error[limit-exceeded]" in out + err and "  ^^^^^^^^^^^^\n" in out + err
    code, out, err = run_cli(["fmt", "--check", "**/*.steer"])
    assert code == 1 and "error[limit-exceeded]" in err and "Traceback" not in err
    assert checked(["a/*.steer"]) == (0, ["a/z.steer"])  # 5 entries are enough for a narrow glob


def test_globs_match_as_python_glob_does_where_no_link_loops(tree):
    """The steerc glob is glob.glob(recursive=True) without entering links to folders in `**`."""
    import glob

    from steerc.cli.inputs import glob_programs

    for pattern in ["**/*.steer", "a/**", "*/*.steer", "a/**/*.steer", "**/x.steer", ".*/**/*.steer", "a/[b]*/*",
                    "*", "**", str(tree / "**" / "*.steer"), "a/./*.steer", "a//*.steer", "./**/y.steer"]:
        expected = sorted((p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)),
                          key=lambda p: os.path.normpath(p).split(os.sep))
        from steerc.cli.inputs import _components, _crosses_skipped

        fixed = next((n for n, part in enumerate(_components(pattern)) if set("*?[") & set(part)), 0)
        expected = [p for p in expected if not _crosses_skipped(p, fixed)]
        assert glob_programs(pattern) == expected, pattern


# ------------------------------------------------------------ bytes that are not UTF-8


@pytest.mark.parametrize("data, line, column", [
    (b"steer 1\nvector caf\xe9 = [1.0]\n", 2, 11),          # Latin-1
    (b"\xef\xbb\xbfsteer 1\n# \xff\n", 2, 3),               # a BOM, then a byte no character begins with
    (b"steer 1\r\n\r\n# \xe2\x82", 3, 3),                   # a character the file ends inside, after CRLFs
    (b"\xfe\xffsteer 1\n", 1, 1),                           # UTF-16's byte-order mark
])
def test_a_program_that_is_not_utf8_is_a_diagnostic_on_every_path(tmp_path, monkeypatch, data, line, column):
    """check (text and JSON, among other files), fmt, parse, stdin and check_file all give the same
    invalid-encoding diagnostic at the first bad byte, never a usage error or a traceback."""
    import json

    from steerc.api import check_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.steer").write_bytes(data)
    (tmp_path / "good.steer").write_text("steer 1\n", encoding="utf-8")
    code, out, err = run_cli(["check", "bad.steer", "good.steer"])
    text = out + err
    assert code == 1 and "error[invalid-encoding]" in text and f"--> bad.steer:{line}:{column}" in text, text
    assert "2 files checked: 1 error" in text and "Traceback" not in text
    code, out, _ = run_cli(["check", "--format", "json", "bad.steer"])
    (d,) = json.loads(out)["diagnostics"]
    assert code == 1 and (d["code"], d["line"], d["column"]) == ("invalid-encoding", line, column)
    for argv in (["fmt", "--check", "bad.steer", "good.steer"], ["parse", "bad.steer"]):
        code, out, err = run_cli(argv)
        assert code == 1 and f"--> bad.steer:{line}:{column}" in out + err, (argv, out, err)
    result = check_file("bad.steer")
    assert [(x.code, x.span.line, x.span.column) for x in result.diagnostics] == [("invalid-encoding", line, column)]
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "steerc", "check", "-"], input=data, capture_output=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 1 and f"--> <stdin>:{line}:{column}".encode() in done.stdout + done.stderr, done
