"""``steerc tune`` and the safe writes of ``steer.toml`` against hostile input (issue 32).

What tune chooses when a point's numbers are not finite, where its caret points when no point meets the
bounds, and what happens to a user's steer.toml (its mode, its line ends, its byte-order mark, its links,
its dotted keys) when tune or ``derive --calibrate --write`` writes into it. The command-line tests stand
a fixed document in for the evaluation (so they load no model and can tell whether a refusal came before
it); one test runs the whole of tune on the tiny Llama, and the calibrate tests derive on it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat

import pytest
from support import run_cli

NAN, INF = float("nan"), float("inf")
PROGRAM = "steer 1\nparam strength = 1.0\nvector v = load(\"v.safetensors\", key=\"v\")\n" \
          "intervention push {\n  at resid_post[1:3]\n  add strength * v\n}\n"
DATA = '{"prompt": "Hi", "positive": " yes", "negative": " no"}\n{"text": "hello world, how are you today?"}\n'


def _m(mean, low=None, high=None):
    return {"mean": mean, "low": mean if low is None else low, "high": mean if high is None else high, "n": 4}


def _point(strength, behavior, kl, **more):
    metrics = {"behavior": _m(behavior), "behavior_change": _m(behavior), "win_rate": _m(0.5), "kl": _m(kl),
               "perplexity": _m(10.0), "perplexity_ratio": _m(1.0)}
    metrics.update({k: _m(v) for k, v in more.items()})
    return {"program": "p.steer", "params": {"strength": float(strength)}, "metrics": metrics}


def _doc(*points):
    return {"points": list(points)}


# ---------------------------------------------------------------- the choice


def test_a_point_whose_numbers_are_not_finite_is_never_the_winner():
    """Issue 32: with --sweep strength=2e38:0:2 the first point overflows float32 and all its metrics are
    NaN; no comparison ranks a point above NaN, so tune chose it and wrote `strength = 2e+38`. A point whose
    goal, bounded metric or any other metric is not finite is now excluded, and says why."""
    from steerc.eval.tune import Term, choose, explain, parse_rule, summary

    doc = _doc(_point(2e38, NAN, NAN, win_rate=0.0), _point(0, 0.2, 0.0))
    rule = parse_rule("behavior", None, [])
    c = choose(doc, rule)
    assert (c.best, c.runner_up, c.feasible) == (1, None, (1,))
    (i, why, value), = c.excluded
    assert i == 0 and why == Term("behavior", "mean") and math.isnan(value)
    assert "excluded: strength=2e+38 (behavior nan, not a finite number)" in explain(doc, rule, c)
    entry, = summary(doc, rule, c, None)["excluded"]
    assert entry["bound"] is None and entry["metric"] == "behavior" and "not a finite number" in entry["why"]

    up = _doc(_point(1, INF, 0.0), _point(2, 3.0, 0.0))  # +inf would win any maximization
    assert choose(up, rule).best == 1
    down = _doc(_point(1, 1.0, -INF), _point(2, 1.0, 0.5))
    assert choose(down, parse_rule(None, "kl", [])).best == 1


@pytest.mark.parametrize("bound, other", [("kl<=0.5", None), (None, "kl"), ("kl.high<=0.5", None)])
def test_a_bounded_or_other_metric_that_is_not_finite_excludes_its_point(bound, other):
    """Issue 32: NaN in a bound's metric (or its interval's end), or in a metric the rule does not name,
    marks a point whose steered forward overflowed: it is out, whatever its goal."""
    from steerc.eval.tune import Term, choose, parse_rule

    bad = _point(1, 9.0, 0.1)
    if bound and ".high" in bound:
        bad["metrics"]["kl"]["high"] = NAN
    else:
        bad["metrics"]["kl"]["mean"] = NAN
    c = choose(_doc(bad, _point(2, 1.0, 0.1)), parse_rule("behavior", None, [bound] if bound else []))
    assert c.best == 1
    (i, why, _), = c.excluded
    assert i == 0 and isinstance(why, Term) and why.metric == "kl"


def test_with_no_finite_point_the_goal_is_to_blame():
    """Issue 32: every point overflowed: no bound is to blame (and a rule without bounds has none to point
    at, where tune used to fail on rule.bounds[0])."""
    from steerc.eval.tune import choose, no_winner, parse_rule

    doc = _doc(_point(2e38, NAN, NAN), _point(3e38, NAN, NAN))
    for bounds in ([], ["kl<=1"]):
        rule = parse_rule("behavior", None, bounds)
        why = no_winner(doc, rule, choose(doc, rule))
        assert (why.flag, why.index) == ("--maximize", 0) and "finite" in why.message


def test_the_bound_that_excluded_every_point_is_the_one_blamed():
    """Issue 32: with two bounds, tune pointed at the first even when only the second excluded every point.
    The bound that excludes the most is blamed, with how near a point came to meeting it."""
    from steerc.eval.tune import choose, no_winner, parse_rule

    doc = _doc(_point(0, 1.0, 0.0), _point(2, 2.0, 0.2), _point(4, 3.0, 0.4))
    rule = parse_rule("behavior", None, ["kl<=0.3", "behavior>=5"])
    why = no_winner(doc, rule, choose(doc, rule))
    assert (why.flag, why.index) == ("--subject-to", 1)
    assert "behavior>=5 excludes all 3 points" in why.message
    assert "meeting the other bounds was behavior 2 at strength=2" in why.message and why.others == ()

    both = parse_rule("behavior", None, ["kl<=-1", "behavior>=5"])
    why = no_winner(doc, both, choose(doc, both))
    assert why.index == 0 and "the nearest was kl 0 at strength=0" in why.message
    assert why.others == ((1, "behavior>=5 also excludes every point"),)

    apart = parse_rule("behavior", None, ["kl<=0.1", "behavior>=1.5"])  # neither alone, both together
    why = no_winner(doc, apart, choose(doc, apart))
    assert why.index == 0 and "kl<=0.1 excludes 2 of 3 points" in why.message
    assert why.others == ((1, "behavior>=1.5 excludes the 1 point kl<=0.1 leaves"),)


# ------------------------------------------------------------- the edit itself


@pytest.mark.parametrize("before, values, after", [
    # each line keeps its own end; a new line ends as the line before it
    ("[params]\r\nstrength = 1\nother = 2\r\n# end\n", {"strength": 3.0, "bias": 1.0},
     "[params]\r\nstrength = 3.0\nother = 2\r\nbias = 1.0\r\n# end\n"),
    # a new table takes the ending most lines have
    ("[defaults]\r\nmodel = \"m\"\r\ntarget = \"hf\"\n", {"strength": 2.0},
     "[defaults]\r\nmodel = \"m\"\r\ntarget = \"hf\"\n\r\n[params]\r\nstrength = 2.0\r\n"),
    # lone carriage returns, which check and run read as line ends
    ("[params]\rstrength = 1\r", {"strength": 2.0}, "[params]\rstrength = 2.0\r"),
    # a byte-order mark stays
    ("\ufeff[params]\nstrength = 1\n", {"strength": 2.0, "bias": 0.5},
     "\ufeff[params]\nstrength = 2.0\nbias = 0.5\n"),
    # dotted keys: the value replaced where it stands, a new one as a dotted key after the last
    ("params.strength = 1  # mine\nparams.other = 2\n\n[defaults]\nmodel = \"m\"\n", {"strength": 3.0, "bias": 1.0},
     "params.strength = 3.0  # mine\nparams.other = 2\nparams.bias = 1.0\n\n[defaults]\nmodel = \"m\"\n"),
    # a file without a final line end keeps none
    ("[params]\nstrength = 1", {"bias": 2.0}, "[params]\nstrength = 1\nbias = 2.0"),
])
def test_the_edit_keeps_every_line_end_the_mark_and_dotted_keys(before, values, after):
    """Issue 32: a steer.toml with mixed CRLF/LF line ends came back all CRLF, one with a byte-order mark was
    refused, and a dotted `params.x = 1` made tune crash after the whole evaluation."""
    from steerc.core.source import decode_program
    from steerc.project.edit import set_params
    from steerc.project.toml import tomllib

    assert set_params(before, values) == after
    assert tomllib.loads(decode_program(after.encode()))["params"] == \
        {**tomllib.loads(decode_program(before.encode())).get("params", {}), **values}


def test_an_inline_params_table_is_refused_at_its_place():
    from steerc.project.edit import EditError, set_params

    text = "# shared\nparams = {strength = 1.0}\n"
    with pytest.raises(EditError) as info:
        set_params(text, {"strength": 2.0})
    start, end = info.value.span
    assert text[start:end] == "params" and "[params] table" in info.value.help


# --------------------------------------------------------------- the writer


def _read_only(path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o444)


def _stat(path):
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_ino, st.st_nlink


def test_the_writer_keeps_the_mode_and_follows_links(tmp_path):
    """Issue 32: the written file took the temporary file's mode (0600), and a symbolic or hard link was
    replaced by a regular file: the shared settings silently stopped being followed."""
    from steerc.project.write import read, write

    plain = tmp_path / "plain.toml"
    plain.write_bytes(b"a = 1\n")
    os.chmod(plain, 0o664)
    write(str(plain), "a = 2\n")
    assert plain.read_bytes() == b"a = 2\n" and _stat(plain)[0] == 0o664

    shared = tmp_path / "shared" / "settings.toml"
    shared.parent.mkdir()
    shared.write_bytes(b"\xef\xbb\xbfa = 1\r\n")
    os.chmod(shared, 0o640)
    link = tmp_path / "steer.toml"
    link.symlink_to(os.path.relpath(shared, tmp_path))
    text, bom = read(str(link))
    assert (text, bom) == ("a = 1\r\n", True)
    write(str(link), "a = 2\r\n", bom)
    assert link.is_symlink() and shared.read_bytes() == b"\xef\xbb\xbfa = 2\r\n" and _stat(shared)[0] == 0o640

    other = tmp_path / "other.toml"
    os.link(shared, other)
    before = _stat(shared)
    write(str(link), "a = 3\n")
    assert _stat(shared) == before and other.read_bytes() == b"a = 3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.toml", "plain.toml", "shared", "steer.toml"]
    assert os.listdir(shared.parent) == ["settings.toml"]  # no temporary file left behind


def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path):
    from steerc.project.write import write

    mask = os.umask(0o027)
    try:
        write(str(tmp_path / "steer.toml"), "[params]\n")
    finally:
        os.umask(mask)
    assert _stat(tmp_path / "steer.toml")[0] == 0o640


@pytest.mark.parametrize("make, says", [
    (lambda d: _read_only(d / "steer.toml", "a = 1\n"), "is read-only"),
    (lambda d: (d / "steer.toml").symlink_to(d / "gone.toml"), "which does not exist"),
    (lambda d: (d / "steer.toml").mkdir(), "not a regular file"),
    (lambda d: os.chmod(d, 0o555), "cannot be created: its folder .* is read-only"),
    (lambda d: (d / "steer.toml").write_bytes(b"a = '\xff'\n"), "not UTF-8"),
])
def test_the_writer_refuses_before_writing(tmp_path, make, says):
    """Issue 32: a read-only steer.toml was overwritten (rename needs no permission on the file). It is
    refused, even for the superuser, as an editor refuses; so are a dangling link and what is no file."""
    from steerc.project.write import WriteError, read, target

    make(tmp_path)
    with pytest.raises(WriteError, match=says):
        target(str(tmp_path / "steer.toml"))
        read(str(tmp_path / "steer.toml"))


def test_an_in_place_write_that_fails_puts_the_old_bytes_back(tmp_path, monkeypatch):
    """A file with two names is overwritten in place; a full disk half way leaves it as it was."""
    from steerc.project import write as W

    path = tmp_path / "steer.toml"
    path.write_bytes(b"[params]\nstrength = 1.0\n")
    os.link(path, tmp_path / "also.toml")
    real = os.pwrite
    calls = []

    def full(fd, data, at):
        calls.append(at)
        if len(calls) == 1:
            real(fd, bytes(data[:5]), at)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, at)

    monkeypatch.setattr(W.os, "pwrite", full)
    with pytest.raises(W.WriteError, match="No space left"):
        W.write(str(path), "[params]\nstrength = 2.0  # a longer line than before\n")
    assert path.read_bytes() == b"[params]\nstrength = 1.0\n"


# ------------------------------------------------ tune on the command line


@pytest.fixture()
def project(tmp_path, monkeypatch):
    (tmp_path / "p.steer").write_text(PROGRAM)
    (tmp_path / "e.jsonl").write_text(DATA)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture()
def scored(monkeypatch):
    """tune's evaluation replaced by a fixed document: ``scored.doc`` is what it returns, ``scored.ran``
    whether it got past the checks before the model loads (the hook tune passes)."""
    from steerc.cli import eval as eval_cli
    from steerc.cli.common import data_source
    from steerc.eval.data import parse_items

    class Fake:
        doc = _doc(_point(2e38, NAN, NAN), _point(0, 0.2, 0.0), _point(2, 0.5, 0.1))
        ran = False

    def fake(args, before_load=None):
        refused = before_load(parse_items(data_source(args.data))) if before_load else None
        if refused is not None:
            return refused
        Fake.ran = True
        return Fake.doc

    monkeypatch.setattr(eval_cli, "scored", fake)
    return Fake


def _tune(*extra):
    return run_cli(["tune", "p.steer", "--model", "smollm2", "--data", "e.jsonl", "--sweep", "strength=2e38:0:3",
                    "--maximize", "behavior", "--format", "json", *extra])


def test_tune_writes_the_finite_winner(project, scored):
    """Issue 32: the overflowed first point is excluded in the JSON, and the finite winner is written."""
    (project / "steer.toml").write_text("[params]\nstrength = 1.0\n")
    code, out, err = _tune()
    assert code == 0, err
    tuned = json.loads(out)["tune"]
    assert tuned["chosen"]["params"] == {"strength": 2.0}
    assert tuned["excluded"] == [{"index": 0, "params": {"strength": 2e38}, "bound": None, "metric": "behavior",
                                  "value": {"float": "nan"}, "why": "behavior nan, not a finite number"}]
    assert (project / "steer.toml").read_text() == "[params]\nstrength = 2.0\n"


def test_tunes_caret_is_under_the_bound_that_excluded_every_point(project, scored):
    """Issue 32: the caret went under the first --subject-to when only the second excluded every point."""
    code, _, err = run_cli(["tune", "p.steer", "--model", "smollm2", "--data", "e.jsonl", "--sweep",
                            "strength=0:2:2", "--maximize", "behavior", "--subject-to", "kl<=0.3",
                            "--subject-to", "behavior>=5"])
    assert code == 1 and "invalid-value" in err and "behavior>=5 excludes all 2 points" in err, err
    assert "the nearest of the points meeting the other bounds was behavior 0.5 at strength=2" in err
    lines = err.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("1 | "))
    caret = lines[at + 1]
    assert caret.index("^") == lines[at].index("behavior>=5") and caret.count("^") == len("behavior>=5")


def test_tune_without_a_finite_point_points_at_the_goal(project, scored):
    scored.doc = _doc(_point(2e38, NAN, NAN))
    (project / "steer.toml").write_text("[params]\nstrength = 1.0\n")
    code, _, err = run_cli(["tune", "p.steer", "--model", "smollm2", "--data", "e.jsonl", "--sweep",
                            "strength=2e38:3e38:2", "--maximize", "behavior"])
    assert code == 1 and "no point of the sweep has finite metrics" in err and "Traceback" not in err, err
    assert (project / "steer.toml").read_text() == "[params]\nstrength = 1.0\n"


@pytest.mark.parametrize("before, after", [
    ("[params]\r\nstrength = 1.0\n# by hand\r\n", "[params]\r\nstrength = 2.0\n# by hand\r\n"),
    ("\ufeff# shared\n[params]\nstrength = 1.0\n", "\ufeff# shared\n[params]\nstrength = 2.0\n"),
    ("params.strength = 1.0\n[defaults]\ntarget = \"hf\"\n", "params.strength = 2.0\n[defaults]\ntarget = \"hf\"\n"),
    ("params.other = 1.0\n", "params.other = 1.0\nparams.strength = 2.0\n"),
])
def test_tune_keeps_line_ends_the_mark_and_dotted_keys(project, scored, before, after):
    """Issue 32: mixed line ends became all CRLF; a byte-order mark, which check, run and eval read, was
    refused after the whole evaluation; a dotted `params.x = 1` crashed tune after it."""
    path = project / "steer.toml"
    path.write_bytes(before.encode())
    os.chmod(path, 0o640)
    code, _, err = _tune()
    assert code == 0, err
    assert path.read_bytes() == after.encode() and _stat(path)[0] == 0o640


def test_tune_writes_through_a_symbolic_link_and_a_hard_link(project, scored):
    """Issue 32: a steer.toml that links to shared settings became a file of its own."""
    shared = project / "shared.toml"
    shared.write_text("[params]\nstrength = 1.0\n")
    (project / "steer.toml").symlink_to("shared.toml")
    os.link(shared, project / "copy.toml")
    inode = os.stat(shared).st_ino
    code, _, err = _tune()
    assert code == 0, err
    assert (project / "steer.toml").is_symlink() and os.stat(shared).st_ino == inode
    assert shared.read_text() == (project / "copy.toml").read_text() == "[params]\nstrength = 2.0\n"


@pytest.mark.parametrize("make, says, code", [
    (lambda d: _read_only(d / "steer.toml", "[params]\nstrength = 1.0\n"), "is read-only", 2),
    (lambda d: (d / "steer.toml").symlink_to("elsewhere/steer.toml"), "which does not exist", 2),
    (lambda d: (d / "steer.toml").write_text("# one\nparams = {strength = 1.0}\n"), "inline table", 1),
])
def test_tune_refuses_an_unwritable_steer_toml_before_the_evaluation(project, scored, make, says, code):
    """Issue 32: a read-only steer.toml was overwritten, and a form tune cannot write was found only after
    the whole evaluation had run. Both are refused before it, the file untouched."""
    make(project)
    path = project / "steer.toml"
    before = path.read_bytes() if path.is_file() else None
    got, out, err = _tune()
    assert got == code and says in err + out and not scored.ran, err
    assert (path.read_bytes() if path.is_file() else None) == before
    if code == 1:
        assert "invalid-config" in out and "cannot write its params" in out
        assert json.loads(out)["diagnostics"][0]["line"] == 2
    got, _, err = _tune("--dry-run")  # writes nothing, so needs no writable file
    assert got == 0 and scored.ran, err


# ------------------------------------------------------------ on the tiny Llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random Llama with a real (small, in-memory-trained) tokenizer, saved as a model folder."""
    from tiny_models import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-model"))


def _vector(path, seed=0):
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"v": np.random.default_rng(seed).uniform(-1, 1, 64).astype(np.float32)}, str(path))


def test_tune_on_a_model_never_writes_an_overflowed_strength(project, folder):
    """Issue 32, end to end: strength 2e38 overflows float32 in the steered forward; tune chooses strength 0
    and writes it."""
    _vector(project / "v.safetensors")
    (project / "steer.toml").write_text("[params]\nstrength = 1.0  # by hand\n")
    code, out, err = run_cli(["tune", "p.steer", "--model", folder, "--data", "e.jsonl", "--sweep",
                              "strength=2e38:0:2", "--maximize", "behavior", "--resamples", "20", "--format", "json"])
    assert code == 0, err
    tuned = json.loads(out)["tune"]
    assert tuned["chosen"]["params"] == {"strength": 0.0}
    assert [e["index"] for e in tuned["excluded"]] == [0] and tuned["excluded"][0]["bound"] is None
    assert (project / "steer.toml").read_text() == "[params]\nstrength = 0.0  # by hand\n"


CAST = ('steer 1\nparam threshold = 0.5\nvector topic = load("v.safetensors", key="v")\n\n'
        "probe about {\n  at   resid_pre[2]\n  read cosine(topic)\n  pool prompt.mean\n}\n\n"
        "intervention x {\n  at     resid_post[3]\n  scale  2\n  tokens generated\n  when   about OP threshold\n}\n")
POS = ["yes, because it is raining.", "hello world, how are you today?", "Answer: yes", "ok true"]
NEG = ["no, because the sun is out.", "goodbye world", "Answer: no", "ok false"]


@pytest.fixture()
def cast(project):
    _vector(project / "v.safetensors", seed=1)
    (project / "pos.txt").write_text("\n".join(POS) + "\n")
    (project / "neg.txt").write_text("\n".join(NEG) + "\n")
    return project


def _calibrate(folder, *extra):
    return run_cli(["derive", "--model", folder, "--positive", "pos.txt", "--negative", "neg.txt", "--calibrate",
                    "cast.steer", "--probe", "about", *extra])


def test_calibrate_writes_its_threshold_where_the_gate_reads_it(cast, folder):
    """Issue 32 (friction): `derive --calibrate` printed the threshold but could not write it. `--write PARAM`
    writes it into steer.toml [params], keeping the file's other bytes, when the gate compares the probe
    with that param the way the calibration found; the other way round, nothing is written."""
    (cast / "cast.steer").write_text(CAST.replace("OP", ">"))
    code, out, _ = _calibrate(folder, "--format", "json")
    assert code == 0
    op, threshold = json.loads(out)["op"], json.loads(out)["threshold"]
    flipped = "<" if op == ">" else ">"
    (cast / "cast.steer").write_text(CAST.replace("OP", op))
    (cast / "steer.toml").write_bytes(b"# shared\r\n[params]\r\nthreshold = 0.5  # by hand\r\n")
    code, out, err = _calibrate(folder, "--write", "threshold")
    assert code == 0, err
    assert f"wrote threshold = {threshold:.6g} to steer.toml [params]" in out
    assert (cast / "steer.toml").read_bytes() == \
        f"# shared\r\n[params]\r\nthreshold = {threshold!r}  # by hand\r\n".encode()

    (cast / "cast.steer").write_text(CAST.replace("OP", flipped))
    before = (cast / "steer.toml").read_bytes()
    code, _, err = _calibrate(folder, "--write", "threshold")
    assert code == 1 and "opens the other way" in err and "nothing was written" in err, err
    line = next(x for x in err.splitlines() if "when   about" in x)
    caret = err.splitlines()[err.splitlines().index(line) + 1]
    assert caret.index("^") == line.index("about")
    assert (cast / "steer.toml").read_bytes() == before


@pytest.mark.parametrize("program, toml, says", [
    (CAST.replace("OP threshold", "> limit").replace("param threshold", "param limit"), "",
     "declares no param threshold"),
    (CAST.replace("OP threshold", "> 0.5"), "", "no gate of cast.steer compares about with threshold"),
    (CAST.replace("OP", ">"), "read-only", "is read-only"),
    (CAST.replace("OP", ">"), "params = {threshold = 0.5}\n", "inline table"),
])
def test_calibrate_write_is_refused_before_the_model_loads(cast, folder, monkeypatch, program, toml, says):
    """Issue 32 (friction): what would keep --write from writing is found before the probe runs."""
    from steerc.cli import derive

    def never(*a, **k):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(derive, "load_checked", never)
    (cast / "cast.steer").write_text(program)
    path = cast / "steer.toml"
    path.write_text("[params]\nthreshold = 0.5\n" if toml == "read-only" else toml)
    if toml == "read-only":
        os.chmod(path, 0o444)
    before = path.read_bytes()
    code, _, err = _calibrate(folder, "--write", "threshold")
    assert code in (1, 2) and says in err and "Traceback" not in err, err
    assert path.read_bytes() == before
    code, _, err = run_cli(["derive", "--model", folder, "--data", "x.jsonl", "--at", "resid_post[1]", "-o", "b.st",
                            "--write", "threshold"])
    assert code == 2 and "--write PARAM goes with --calibrate" in err
