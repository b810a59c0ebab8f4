"""`steerc derive`: the methods against direct computations, the reading against HF's own hidden states,
the bank and its provenance, the cache, the diagnostics for bad data, and --calibrate.

The methods are checked here against independent computations (an eigendecomposition for the PCAs,
a full Newton solve for the logistic regression, brute force for AUROC and thresholds); their
agreement with the peers themselves (steering-vectors, repeng) on SmolLM2 runs in
tests/peers (``./dev test-peers``, a second environment where those libraries install).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import run_cli

from steerc.derive import methods as M

# ---------------------------------------------------------------------- methods


def _data(n=10, d=12, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, d))
    shift = rng.normal(size=d)
    return base + shift + 0.3 * rng.normal(size=(n, d)), base - shift + 0.3 * rng.normal(size=(n, d))


def _eig_component(train):
    x = train - train.mean(axis=0)
    w, v = np.linalg.eigh(x.T @ x)
    return v[:, -1]


def test_mean_diff_is_the_mean_of_paired_differences():
    pos, neg = _data()
    assert np.allclose(M.mean_diff(pos, neg), np.mean([p - q for p, q in zip(pos, neg)], axis=0), atol=1e-14)


@pytest.mark.parametrize("method", ["pca_diff", "pca_center"])
def test_pca_methods_are_the_first_component_of_repengs_training_set(method):
    pos, neg = _data()
    got = getattr(M, method)(pos, neg)
    if method == "pca_diff":
        train = pos - neg
    else:
        c = (pos + neg) / 2
        train = np.concatenate([pos - c, neg - c])
    want = _eig_component(train)
    assert abs(np.linalg.norm(got) - 1) < 1e-12
    assert min(np.abs(got - want).max(), np.abs(got + want).max()) < 1e-10
    # repeng's sign: positive examples project above their negatives for most pairs
    assert np.mean(pos @ got > neg @ got) >= 0.5


def test_pca_sign_follows_the_vote_and_ties_keep_sklearns_sign():
    v = np.array([0.6, -0.8])
    pos = np.array([[1.0, 0.0], [0.0, 1.0]])
    neg = np.array([[0.0, 0.0], [0.0, 0.0]])
    # pair 0 projects +0.6, pair 1 -0.8: a tie, kept
    assert np.array_equal(M.repeng_sign(v, pos, neg), v)
    assert np.array_equal(M.repeng_sign(v, neg[:1] + [[0, 1]], neg[:1]), -v)
    comp = M.first_component(np.array([[1.0, -3.0], [-1.0, 3.0], [2.0, -6.1]]))
    assert comp[np.argmax(np.abs(comp))] > 0


@pytest.mark.parametrize("n, d", [(6, 40), (16, 64), (50, 5)])
def test_logistic_is_the_regularised_optimum(n, d):
    pos, neg = _data(n, d, seed=n)
    w, b = M.logistic(pos, neg)
    x = np.concatenate([pos, neg])
    y = np.r_[np.ones(n), np.zeros(n)]
    full = np.zeros(d + 1)
    xa = np.c_[x, np.ones(2 * n)]
    for _ in range(100):
        p = 1 / (1 + np.exp(-(xa @ full)))
        g = xa.T @ (p - y)
        g[:-1] += full[:-1]
        h = xa.T @ (xa * (p * (1 - p))[:, None])
        h[:-1, :-1] += np.eye(d)
        full -= np.linalg.solve(h, g)
    assert np.abs(full[:-1] - w).max() < 1e-8 and abs(full[-1] - b) < 1e-8


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=1, max_size=12), st.lists(st.integers(-5, 5), min_size=1, max_size=12))
def test_auroc_is_the_share_of_correctly_ordered_pairs(pos, neg):
    want = np.mean([1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg])
    assert M.auroc(np.array(pos, float), np.array(neg, float)) == pytest.approx(want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=1, max_size=10), st.lists(st.floats(-3, 3), min_size=1, max_size=10))
def test_best_threshold_is_optimal_over_every_cut(pos, neg):
    op, t, f1, acc = M.best_threshold(pos, neg)
    p, n = np.array(pos), np.array(neg)
    held = (p > t) if op == ">" else (p < t)
    wrong = (n > t) if op == ">" else (n < t)
    tp, fp = held.sum(), wrong.sum()
    assert f1 == pytest.approx(2 * tp / (2 * tp + fp + (len(p) - tp)) if tp else 0.0)
    assert acc == pytest.approx((tp + len(n) - fp) / (len(p) + len(n)))
    for cut in np.concatenate([p, n, [min(pos + neg) - 1, max(pos + neg) + 1]]):
        for o in (">", "<"):
            tp2 = ((p > cut) if o == ">" else (p < cut)).sum()
            fp2 = ((n > cut) if o == ">" else (n < cut)).sum()
            f = 2 * tp2 / (2 * tp2 + fp2 + len(p) - tp2) if tp2 else 0.0
            assert f <= f1 + 1e-12


def test_split_is_seeded_and_keeps_both_sides():
    a = M.split(8, 0.25, 0)
    assert np.array_equal(a[0], M.split(8, 0.25, 0)[0]) and len(a[1]) == 2 and len(a[0]) == 6
    assert len(M.split(3, 0.01, 1)[1]) == 1 and len(M.split(3, 0.99, 1)[0]) == 1


# ------------------------------------------------------------------ end to end

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

POS = ["yes, because it is raining.", "hello world, how are you today?", "The quick brown fox jumps.",
       "Answer: yes", "ok true", "0123 yes", "maybe yes", "[1, 2, 3] yes"]
NEG = ["no, because the sun is out.", "goodbye world", "The lazy dog sleeps.", "Answer: no", "ok false", "9876 no",
       "maybe no", "[3, 2, 1] no"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random Llama with a real (small, in-memory-trained) tokenizer, saved as a model folder."""
    from tiny_models import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def project(tmp_path, monkeypatch):
    (tmp_path / "steer.toml").write_text("")
    with open(tmp_path / "pairs.jsonl", "w") as fh:
        for a, b in zip(POS, NEG):
            fh.write(json.dumps({"positive": a, "negative": b}) + "\n")
    (tmp_path / "pos.txt").write_text("\n".join(POS) + "\n")
    (tmp_path / "neg.txt").write_text("\n".join(NEG) + "\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _derive(folder, *extra):
    return run_cli(["derive", "--model", folder, *extra])


def test_derive_writes_a_bank_with_its_provenance(folder, project):
    code, out, err = _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[1:3]", "--method", "all",
                             "-o", "bank.safetensors")
    assert code == 0, err
    from safetensors import safe_open

    with safe_open("bank.safetensors", "np") as f:
        names = sorted(f.keys())
        meta = json.loads(f.metadata()["steerc.derive"])
    assert names == sorted([f"{m}.{layer}" for m in M.METHODS for layer in (1, 2)]
                           + ["logistic_bias.1", "logistic_bias.2"])
    assert meta["site"] == "resid_post" and meta["layers"] == [1, 2] and meta["methods"] == list(M.METHODS)
    assert meta["dataset"]["pairs"] == 8 and len(meta["dataset"]["sha256"]) == 64
    assert meta["reading"] == {"chat": False, "read": "last"} and meta["heldout"]["pairs"] == 2
    assert set(meta["scores"]) == set(M.METHODS) and set(meta["scores"]["mean_diff"]) == {"1", "2"}
    assert "held-out AUROC (2 of 8 pairs" in out and 'key="mean_diff' in out
    code, out2, _ = _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[1:3]", "--method", "all",
                            "-o", "again.safetensors")
    assert code == 0 and open("bank.safetensors", "rb").read() == open("again.safetensors", "rb").read()


def _metadata(path: str) -> dict:
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        return json.loads(f.metadata()["steerc.derive"])


def test_the_banks_metadata_has_the_keys_spec_derive_promises(folder, project):
    """`steerc` is the version; `dataset.sha256` is the sha256 of the data files' bytes (hashlib on the files,
    CR LF line ends and non-ASCII kept as they are on disk), one after the other for --positive/--negative."""
    import hashlib

    import steerc

    crlf = "".join(json.dumps({"positive": a + " \u00e9", "negative": b}, ensure_ascii=False) + "\r\n"
                   for a, b in zip(POS, NEG))
    (project / "crlf.jsonl").write_bytes(crlf.encode("utf-8"))
    (project / "neg.txt").write_bytes(("\r\n".join(NEG) + "\r\n").encode("utf-8"))
    assert _derive(folder, "--data", "crlf.jsonl", "--at", "resid_post[1]", "-o", "a.safetensors")[0] == 0
    assert _derive(folder, "--positive", "pos.txt", "--negative", "neg.txt", "--at", "resid_post[1]",
                   "-o", "b.safetensors")[0] == 0
    one, two = _metadata("a.safetensors"), _metadata("b.safetensors")
    assert one["steerc"] == two["steerc"] == steerc.__version__ and "steerc_version" not in one
    assert one["dataset"]["sha256"] == hashlib.sha256((project / "crlf.jsonl").read_bytes()).hexdigest()
    both = (project / "pos.txt").read_bytes() + (project / "neg.txt").read_bytes()
    assert two["dataset"]["sha256"] == hashlib.sha256(both).hexdigest()
    assert one["dataset"]["files"] == ["crlf.jsonl"] and two["dataset"]["files"] == ["pos.txt", "neg.txt"]


def test_the_activation_cache_tells_apart_two_files_whose_bytes_join_the_same():
    """dataset.sha256 hashes the files' bytes one after the other (the spec's definition); the cache is keyed on
    each file's, since two splits of the same bytes can make other pairs."""
    from steerc.core.source import Source
    from steerc.derive import activations as A
    from steerc.derive import data as D

    a = D.paired_lines(Source("p", "a\nb\nx"), Source("n", "yz\nd\ne\n"))
    b = D.paired_lines(Source("p", "a\nb\nxy"), Source("n", "z\nd\ne\n"))
    assert a.sha256 == b.sha256 and a.pairs != b.pairs
    reading = A.Reading(False, "last")
    assert A.cache_key("m", a, reading) != A.cache_key("m", b, reading)


def test_the_bank_loads_per_layer_and_checks_clean(folder, project):
    assert _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[1:3]", "-o", "v.safetensors")[0] == 0
    (project / "use.steer").write_text(
        'steer 1\n\nvector joy = load("v.safetensors", key="mean_diff", per_layer=true)\n\n'
        "intervention x {\n  at  resid_post[1:3]\n  add joy\n}\n")
    code, out, _ = run_cli(["check", "use.steer", "--model", folder])
    assert code == 0 and "0 errors, 0 warnings" in out, out


def _hidden(folder, text, layer):
    """HF's own hidden_states[layer + 1] (decoder layer ``layer``'s output) for one text, unpadded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        return model(**ids, output_hidden_states=True).hidden_states[layer + 1][0].double().numpy()


@pytest.mark.parametrize("read", ["last", "mean"])
def test_activations_are_hfs_hidden_states_whatever_the_batch(folder, project, read):
    """Batched with right padding, the read activations equal each text's own, unpadded hidden state."""
    from safetensors.numpy import load_file

    code, _, err = _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[2]", "--read", read,
                           "--batch-size", "3", "-o", "v.safetensors", "--heldout", "0")
    assert code == 0, err
    h = [_hidden(folder, t, 2) for t in POS + NEG]
    acts = [x[-1] if read == "last" else x.mean(axis=0) for x in h]
    want = np.mean([a - b for a, b in zip(acts[:8], acts[8:])], axis=0)
    got = load_file("v.safetensors")["mean_diff.2"]
    assert np.abs(got - want).max() < 2e-5 * max(1.0, np.abs(want).max())


def test_completion_reading_averages_the_completion_only(folder, project):
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    with open("qa.jsonl", "w") as fh:
        fh.write(json.dumps({"prompt": "Answer:", "positive": " yes yes", "negative": " no no"}) + "\n")
        fh.write(json.dumps({"prompt": "ok", "positive": " true", "negative": " false"}) + "\n")
    code, _, err = _derive(folder, "--data", "qa.jsonl", "--at", "resid_post[1]", "--read", "completion",
                           "-o", "c.safetensors", "--heldout", "0")
    assert code == 0, err
    tok = AutoTokenizer.from_pretrained(folder)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()

    def act(prompt, completion):
        head = tok(prompt)["input_ids"]
        tail = tok(completion, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            hs = model(input_ids=torch.tensor([head + tail]), output_hidden_states=True).hidden_states[2][0]
        return hs[len(head):].double().mean(dim=0).numpy()

    want = ((act("Answer:", " yes yes") - act("Answer:", " no no")) + (act("ok", " true") - act("ok", " false"))) / 2
    assert np.abs(load_file("c.safetensors")["mean_diff.1"] - want).max() < 1e-5
    code, _, err = _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[1]", "--read", "completion",
                           "-o", "x.safetensors")
    assert code == 1 and "error[invalid-data]" in err and "--read" in err


def test_a_rerun_reads_the_cache_without_loading_the_model(folder, project, monkeypatch):
    args = ["--data", "pairs.jsonl", "--at", "resid_post[1:3]", "-o", "a.safetensors"]
    assert _derive(folder, *args)[0] == 0
    import steerc.runtime.models as models

    def no_load(*a, **k):
        raise AssertionError("the model was loaded although the activations are cached")

    monkeypatch.setattr(models, "load_model", no_load)
    code, _, err = _derive(folder, *args[:-1], "b.safetensors")
    assert code == 0, err
    assert open("a.safetensors", "rb").read() == open("b.safetensors", "rb").read()
    with pytest.raises(AssertionError, match="was loaded"):  # a layer not read before needs the model
        _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[0:3]", "-o", "c.safetensors")


def test_plot_is_a_png(folder, project):
    pytest.importorskip("matplotlib")
    code, out, err = _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[*]", "--method", "mean_diff,pca_diff",
                             "-o", "v.safetensors", "--plot", "layers.png")
    assert code == 0, err
    assert open("layers.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n" and "plot: layers.png" in out


# ------------------------------------------------------------------- diagnostics


@pytest.mark.parametrize("lines, code, where", [
    (['{"positve": "a", "negative": "b"}'], "invalid-data", "did you mean `positive`"),
    (["not json"], "invalid-data", "not a JSON object"),
    (['["a", "b"]'], "invalid-data", "not an object"),
    (['{"positive": "a"}'], "invalid-data", "no 'negative'"),
    (['{"positive": "", "negative": "b"}'], "invalid-data", "is empty"),
    (['{"positive": 3, "negative": "b"}'], "invalid-data", "not a string"),
    (["", "   "], "empty-data", "no pairs"),
])
def test_bad_pairs_are_diagnostics_with_a_caret(folder, project, lines, code, where):
    (project / "bad.jsonl").write_text("\n".join(lines) + "\n")
    rc, _, err = _derive(folder, "--data", "bad.jsonl", "--at", "resid_post[1]", "-o", "v.safetensors")
    assert rc == 1 and f"error[{code}]" in err and where in err, err
    assert "Traceback" not in err and ("^" in err or code == "empty-data")


def test_unbalanced_files_point_at_the_first_unpaired_line(folder, project):
    (project / "short.txt").write_text("\n".join(NEG[:5]) + "\n")
    rc, _, err = _derive(folder, "--positive", "pos.txt", "--negative", "short.txt", "--at", "resid_post[1]",
                         "-o", "v.safetensors")
    assert rc == 1 and "error[unbalanced-data]" in err and "pos.txt:6:1" in err, err


def test_a_site_the_model_lacks_is_a_diagnostic(folder, project):
    rc, _, err = _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[7]", "-o", "v.safetensors")
    assert rc == 1 and "error[" in err and "resid_post[7]" in err and "^" in err, err
    rc, _, err = _derive(folder, "--data", "pairs.jsonl", "--at", "resdi_post[1]", "-o", "v.safetensors")
    assert rc == 1 and "resid_post" in err, err


def test_too_few_pairs_for_a_component(folder, project):
    (project / "one.jsonl").write_text(json.dumps({"positive": "a yes", "negative": "a no"}) + "\n")
    rc, _, err = _derive(folder, "--data", "one.jsonl", "--at", "resid_post[1]", "--method", "pca_diff",
                         "-o", "v.safetensors")
    assert rc == 1 and "error[empty-data]" in err


def test_binary_and_huge_data_files(folder, project):
    (project / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    rc, _, err = _derive(folder, "--data", "bin.jsonl", "--at", "resid_post[1]", "-o", "v.safetensors")
    assert rc == 1 and "not UTF-8" in err and "Traceback" not in err


# -------------------------------------------------------------------- provenance


def test_check_warns_when_a_derived_vector_meets_another_model_or_site(folder, project, examples_dir):
    assert _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[1:3]", "-o", "v.safetensors")[0] == 0
    (project / "use.steer").write_text(
        'steer 1\n\nvector one = load("v.safetensors", key="mean_diff.1")\n'
        'vector bank = load("v.safetensors", key="mean_diff", per_layer=true)\n\n'
        "intervention a {\n  at  attn_out[1]\n  add one\n}\n\n"
        "intervention b {\n  at  resid_pre[1:3]\n  add bank\n}\n\n"
        "intervention c {\n  at  resid_pre[2]\n  add one\n}\n")
    code, out, _ = run_cli(["check", "use.steer", "--model", folder])
    assert code == 0
    assert out.count("warning[vector-site-mismatch]") == 2, out  # c: resid_pre[2] is resid_post[1]: fine
    assert "uses it at attn_out" in out and "a layer earlier in the forward pass" in out
    assert "vector-model-mismatch" not in out
    code, out, _ = run_cli(["check", "use.steer", "--model", os.path.join(examples_dir, "models", "tiny-qwen2")])
    assert "warning[vector-model-mismatch]" in out and "--model is qwen2" in out


# --------------------------------------------------------------------- calibrate


def test_calibrate_finds_the_threshold_the_runtime_gate_would_use(folder, project):
    """The probe values come from the HF runtime's own probe (installed from the program), so the printed
    `when` clause decides the gate exactly as it scored here."""
    assert _derive(folder, "--data", "pairs.jsonl", "--at", "resid_pre[2]", "-o", "v.safetensors",
                   "--normalize")[0] == 0
    (project / "cast.steer").write_text(
        'steer 1\n\nvector topic = load("v.safetensors", key="mean_diff.2")\n\n'
        "probe about {\n  at   resid_pre[2]\n  read projected_cosine(topic)\n  pool prompt.mean\n}\n\n"
        "intervention x {\n  at     resid_post[3]\n  scale  2\n  tokens generated\n  when   about > 0.5\n}\n")
    code, out, err = run_cli(["derive", "--model", folder, "--positive", "pos.txt", "--negative", "neg.txt",
                              "--calibrate", "cast.steer", "--probe", "about", "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["readout"] == "projected_cosine" and report["pool"] == "prompt.mean"
    # the values again, computed directly: CAST's cos(h, tanh(P h)) of the prompt-mean hidden state
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    u = load_file("v.safetensors")["mean_diff.2"].astype(np.float64)
    u /= np.linalg.norm(u)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)

    def value(text):
        with torch.no_grad():
            h = model(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states[2][0]
        m = h.double().mean(dim=0).numpy()
        t = np.tanh(u * (u @ m))
        return float(m @ t / (np.linalg.norm(m) * np.linalg.norm(t)))

    vp, vn = np.array([value(t) for t in POS]), np.array([value(t) for t in NEG])
    assert report["positive"]["mean"] == pytest.approx(vp.mean(), abs=1e-5)
    assert report["negative"]["max"] == pytest.approx(vn.max(), abs=1e-5)
    op, t, f1, acc = M.best_threshold(vp, vn)
    assert (report["op"], report["f1"]) == (op, pytest.approx(f1)) and report["threshold"] == pytest.approx(t, abs=1e-4)
    code, out, _ = run_cli(["derive", "--model", folder, "--positive", "pos.txt", "--negative", "neg.txt",
                            "--calibrate", "cast.steer", "--probe", "about"])
    assert code == 0 and f"when about {op} " in out and "F1" in out and "accuracy" in out
    code, _, err = run_cli(["derive", "--model", folder, "--positive", "pos.txt", "--negative", "neg.txt",
                            "--calibrate", "cast.steer", "--probe", "nope"])
    assert code == 2 and "no probe of that name (about)" in err


def test_a_file_of_bad_lines_stops_at_the_repeat_cap(project):
    """Every kind of bad line counts towards the cap: a 64 MiB file of them stores no more than MAX_REPEATS."""
    from steerc.core.limits import MAX_REPEATS
    from steerc.core.source import Source
    from steerc.derive.data import DataError, parse_pairs

    text = '{"positive": "a"}\n' * (3 * MAX_REPEATS) + "[1]\n" * MAX_REPEATS
    with pytest.raises(DataError) as err:
        parse_pairs(Source("many.jsonl", text))
    assert len(err.value.diagnostics) == MAX_REPEATS
    assert {d.code for d in err.value.diagnostics} == {"invalid-data"}


# ------------------------------------------------------------ the Python entry point


def test_the_python_entry_point_gives_the_clis_bank(folder, project):
    from safetensors import safe_open

    from steerc.derive import derive
    from steerc.runtime.models import load_model

    code, _, err = _derive(folder, "--data", "pairs.jsonl", "--at", "resid_post[*]", "--method", "all",
                           "--read", "mean", "--no-cache", "-o", "cli.safetensors")
    assert code == 0, err
    model, tokenizer = load_model(folder)
    result = derive(model, tokenizer, "pairs.jsonl", at="resid_post[*]", method="all", read="mean")
    with safe_open("cli.safetensors", "np") as f:
        cli = {k: f.get_tensor(k) for k in f.keys()}
        cli_meta = json.loads(f.metadata()["steerc.derive"])
    assert sorted(result.keys()) == sorted(cli)
    for key, row in cli.items():
        assert result[key].dtype == np.float32 and np.array_equal(result[key], row), key
    assert result.scores == cli_meta["scores"] and result.heldout_pairs == cli_meta["heldout"]["pairs"]
    # pairs in memory are the same data as the file's lines
    same = derive(model, tokenizer, list(zip(POS, NEG)), at="resid_post[1]", method="mean_diff", read="mean")
    assert np.array_equal(same["mean_diff.1"], cli["mean_diff.1"])
    # the bank it saves loads in a program and checks against the model, as the CLI's does
    result.save(project / "py.safetensors")
    with safe_open(str(project / "py.safetensors"), "np") as f:
        meta = json.loads(f.metadata()["steerc.derive"])
        assert np.array_equal(f.get_tensor("pca_diff.2"), cli["pca_diff.2"])
    assert meta["model"]["fingerprint"] == cli_meta["model"]["fingerprint"] and meta["layers"] == cli_meta["layers"]
    (project / "use.steer").write_text(
        'steer 1\n\nvector v = load("py.safetensors", key="mean_diff", per_layer=true)\n\n'
        "intervention x {\n  at  resid_post[1:3]\n  add v\n}\n")
    code, out, _ = run_cli(["check", "use.steer", "--model", folder])
    assert code == 0 and "0 errors, 0 warnings" in out, out


def test_the_python_entry_point_raises_diagnostics(folder, project):
    from steerc.derive import DeriveError, derive
    from steerc.runtime.models import load_model

    model, tokenizer = load_model(folder)
    with pytest.raises(DeriveError) as bad:
        derive(model, tokenizer, list(zip(POS, NEG)), at="resid_post[99]")
    assert bad.value.diagnostics[0].code == "layer-out-of-range" and "^" in bad.value.render()
    with pytest.raises(DeriveError) as bad:
        derive(model, tokenizer, list(zip(POS, NEG)), at="resid_post[1]", method="mean_dif")
    assert "did you mean `mean_diff`?" in (bad.value.diagnostics[0].help or "")
    with pytest.raises(DeriveError) as bad:
        derive(model, tokenizer, [("only positive",)], at="resid_post[1]")
    assert bad.value.diagnostics[0].code == "invalid-data"
    with pytest.raises(DeriveError) as bad:
        derive(model, tokenizer, [{"positive": "a", "negativ": "b"}], at="resid_post[1]")
    assert bad.value.diagnostics[0].span is not None and "<pairs>" in bad.value.render()


def test_bank_metadata_is_strict_json_that_provenance_reads_back(tmp_path):
    """A score that is not finite (AUROC of a degenerate split) must not make the metadata unreadable."""
    from safetensors import safe_open

    from steerc.derive import bank

    path = str(tmp_path / "b.safetensors")
    bank.write(path, {"mean_diff.1": np.ones(4)}, {"scores": {"mean_diff": {"1": float("nan")}}, "steerc": "x"})
    with safe_open(path, "np") as f:
        meta = f.metadata()
    assert "NaN" not in meta[bank.METADATA_KEY]
    assert bank.provenance(meta)["scores"]["mean_diff"]["1"] == {"float": "nan"}
