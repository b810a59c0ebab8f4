"""Model layout facts: configs, facts JSON, live models, unknown families, site tables.

The expected values for the real configs were read off the model cards /
papers (they are the published shapes), not computed by steerc, so a
regression in ``steerc.facts.families`` shows up as a wrong number here.
"""

from __future__ import annotations

import functools
import json
import os

import pytest
from support import examples_path, run_cli

from steerc.facts import FACT_FIELDS, FAMILIES, FactsError, ModelFacts, facts_document, facts_from_config, load_facts
from steerc.facts.families import MODEL_TYPES
from steerc.facts.sites import TABLES, site_table

EXAMPLES = examples_path()
MODELS = os.path.join(EXAMPLES, "models")

# family, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied, parallel
TINY = {
    "tiny-llama": ("llama", 4, 64, 4, 2, 16, 128, 512, False, False),
    "tiny-qwen2": ("qwen2", 4, 64, 4, 2, 16, 128, 512, False, False),
    "tiny-gemma2": ("gemma2", 4, 64, 4, 2, 16, 128, 512, True, False),
    "tiny-gpt2": ("gpt2", 4, 64, 4, 4, 16, 256, 512, True, False),
}
REAL = {
    # config says nothing about tying: gemma-2's family default (tied) applies
    "gemma-2-2b": ("gemma2", 26, 2304, 8, 4, 256, 9216, 256000, True, False),
    # no n_inner (4 * hidden), no kv heads (= heads), tied by the family default
    "gpt2": ("gpt2", 12, 768, 12, 12, 64, 3072, 50257, True, False),
    "llama-3.1-8b": ("llama", 32, 4096, 32, 8, 128, 14336, 128256, False, False),
    "mistral-7b-v0.1": ("mistral", 32, 4096, 32, 8, 128, 14336, 32000, False, False),
    "phi-3-mini-4k-instruct": ("phi3", 32, 3072, 32, 32, 96, 8192, 32064, False, False),
    "pythia-160m": ("gpt_neox", 12, 768, 12, 12, 64, 3072, 50304, False, True),
    "qwen2.5-7b-instruct": ("qwen2", 28, 3584, 28, 4, 128, 18944, 152064, False, False),
    "smollm2-135m-instruct": ("llama", 30, 576, 9, 3, 64, 1536, 49152, True, False),
}

# Shipped with the tests (tests/data/real_configs/README.md names each source): the families of issue 15.
REAL_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "real_configs")
REAL_ADDED = {
    "olmo-2-1124-7b-instruct": ("olmo2", 32, 4096, 32, 32, 128, 11008, 100352, False, False),
    "granite-3.3-8b-instruct": ("granite", 40, 4096, 32, 8, 128, 12800, 49159, True, False),
    # silent on tying: Cohere's default (tied); parallel residual always
    "aya-23-8b": ("cohere", 32, 4096, 32, 8, 128, 14336, 256000, True, True),
    "mixtral-8x7b-v0.1": ("mixtral", 32, 4096, 32, 8, 128, 14336, 32000, False, False),
    # intermediate is one routed expert's width (moe_intermediate_size), not the shared expert's 5632
    "qwen1.5-moe-a2.7b-chat": ("qwen2_moe", 24, 2048, 16, 16, 128, 1408, 151936, False, False),
    "qwen3-30b-a3b": ("qwen3_moe", 48, 2048, 32, 4, 128, 768, 151936, False, False),
    "olmoe-1b-7b-0125-instruct": ("olmoe", 16, 2048, 16, 16, 128, 1024, 50304, False, False),
    # 64 heads of 64 = 4096 wide, hidden 2880
    "gpt-oss-20b": ("gpt_oss", 24, 2880, 64, 8, 64, 2880, 201088, False, False),
}


def _model_dir(name: str) -> str:
    path = os.path.join(MODELS, name) if name in TINY else os.path.join(MODELS, "real", name)
    assert os.path.isdir(path), f"{path} not found"
    return path


def _as_tuple(f: ModelFacts) -> tuple:
    return tuple(getattr(f, k) for k in FACT_FIELDS)


# ------------------------------------------------------------- from configs


@pytest.mark.parametrize("name", sorted(TINY) + sorted(REAL))
def test_facts_of_every_shared_config(name):
    facts = load_facts(_model_dir(name))
    assert _as_tuple(facts) == (TINY | REAL)[name]
    # the folder and its config.json give the same facts
    assert load_facts(os.path.join(_model_dir(name), "config.json")) == facts


@pytest.mark.parametrize("name", sorted(REAL_ADDED))
def test_facts_of_every_real_config_shipped_with_the_tests(name):
    facts = load_facts(os.path.join(REAL_CONFIGS, f"{name}.json"))
    assert _as_tuple(facts) == REAL_ADDED[name]


def test_every_family_has_a_real_config():
    shipped = {v[0] for v in REAL_ADDED.values()}
    shared = {v[0] for v in REAL.values()}
    # families read only from transformers' configuration classes so far
    assert set(FAMILIES) - shipped - shared == {"qwen3", "gemma", "gemma3_text"}


def test_gemma2_2b_heads_times_head_dim_is_not_hidden():
    f = load_facts(_model_dir("gemma-2-2b"))
    assert f.heads * f.head_dim == 2048 != f.hidden == 2304
    assert f.width("head") == 256 and f.width("resid_post") == 2304


def _cfg(model_type: str, **extra) -> dict:
    base = {"model_type": model_type, "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
            "intermediate_size": 64, "vocab_size": 100}
    if model_type == "gpt2":
        base = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 100}
    return {**base, **extra}


@pytest.mark.parametrize("family,tied", [
    ("llama", False), ("mistral", False), ("qwen2", False), ("qwen3", False), ("phi3", False),
    ("gemma", True), ("gemma2", True), ("gemma3_text", True), ("gpt2", True), ("gpt_neox", False),
    ("olmo2", False), ("granite", False), ("cohere", True), ("mixtral", False), ("qwen2_moe", False),
    ("qwen3_moe", False), ("olmoe", False), ("gpt_oss", False),
])
def test_tied_embeddings_family_default_and_override(family, tied):
    assert facts_from_config(_cfg(family)).tied_embeddings is tied
    assert facts_from_config(_cfg(family, tie_word_embeddings=not tied)).tied_embeddings is (not tied)


def test_parallel_residual_for_gpt_neox_by_its_key_and_cohere_always():
    assert facts_from_config(_cfg("gpt_neox")).parallel_residual is True  # family default
    assert facts_from_config(_cfg("gpt_neox", use_parallel_residual=False)).parallel_residual is False
    # Cohere has no such key: its layers are always parallel
    assert facts_from_config(_cfg("cohere", use_parallel_residual=False)).parallel_residual is True
    # other families ignore the key
    assert facts_from_config(_cfg("llama", use_parallel_residual=True)).parallel_residual is False


def test_head_dim_rules():
    # an explicit head_dim wins where the family honours it (gemma, llama 3.x style)
    assert facts_from_config(_cfg("gemma2", head_dim=24)).head_dim == 24
    assert facts_from_config(_cfg("llama", head_dim=12)).head_dim == 12
    # qwen2 always uses hidden // heads
    assert facts_from_config(_cfg("qwen2", head_dim=24)).head_dim == 8
    assert facts_from_config(_cfg("llama")).head_dim == 8
    # kv heads default to heads
    assert facts_from_config(_cfg("llama")).kv_heads == 4
    assert facts_from_config(_cfg("llama", num_key_value_heads=1)).kv_heads == 1


def test_gpt2_spellings_and_intermediate_default():
    f = facts_from_config(_cfg("gpt2"))
    assert (f.layers, f.hidden, f.heads, f.kv_heads, f.intermediate) == (2, 32, 4, 4, 128)
    assert facts_from_config(_cfg("gpt2", n_inner=40)).intermediate == 40


def test_multimodal_gemma3_reads_its_text_config():
    cfg = {"model_type": "gemma3", "text_config": {**_cfg("gemma3_text", head_dim=16), "model_type": "gemma3_text"}}
    f = facts_from_config(cfg)
    assert (f.family, f.layers, f.hidden, f.head_dim) == ("gemma3_text", 2, 32, 16)


def test_fingerprint_ignores_origin_and_model_type():
    a = facts_from_config(_cfg("llama"), origin="a")
    b = facts_from_config(_cfg("llama"), origin="b")
    assert a == b and a.fingerprint == b.fingerprint
    c = facts_from_config(_cfg("llama", vocab_size=101))
    assert c.fingerprint != a.fingerprint


# ---------------------------------------------------------------- facts JSON


@pytest.mark.parametrize("backend", ["hf", "vllm"])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "gemma-2-2b", "pythia-160m"])
def test_facts_json_round_trips_through_model(name, backend, tmp_path, monkeypatch):
    src = _model_dir(name)
    code, out, err = run_cli(["facts", src, "--backend", backend])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "steerc.facts/1" and doc["backend"] == backend
    assert doc == facts_document(load_facts(src), backend)
    path = tmp_path / "facts.json"
    path.write_text(out, encoding="utf-8")
    back = load_facts(str(path))
    assert back == load_facts(src)
    assert back.fingerprint == doc["facts"]["fingerprint"] == load_facts(src).fingerprint
    # the facts JSON is itself a valid PATH for `steerc facts` and `--model`
    code, again, _ = run_cli(["facts", str(path), "--backend", backend])
    assert code == 0 and json.loads(again)["facts"] == doc["facts"]
    monkeypatch.chdir(EXAMPLES)
    code, out_json, err = run_cli(["explain", "06_heads.steer", "--format", "json", "--model", str(path)])
    assert code == 0, out_json + err
    assert json.loads(out_json)["model"] == doc["facts"]


def _facts_json(tmp_path, edit) -> str:
    doc = facts_document(load_facts(_model_dir("tiny-llama")), "hf")
    edit(doc)
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("edit", [
    lambda d: d["facts"].__setitem__("fingerprint", "0" * 64),
    lambda d: d["facts"].__setitem__("layers", 5),  # facts edited, fingerprint left stale
], ids=["fingerprint", "facts"])
def test_tampered_facts_json_is_refused(tmp_path, monkeypatch, edit):
    path = _facts_json(tmp_path, edit)
    with pytest.raises(FactsError, match="fingerprint"):
        load_facts(path)
    monkeypatch.chdir(EXAMPLES)
    code, _out, err = run_cli(["check", "02_abliterate.steer", "--model", path])
    assert code == 1 and "error[invalid-model]" in err and "fingerprint" in err


def test_facts_json_without_fingerprint_is_accepted(tmp_path):
    path = _facts_json(tmp_path, lambda d: d["facts"].pop("fingerprint"))
    assert load_facts(path) == load_facts(_model_dir("tiny-llama"))


def test_facts_json_missing_a_fact_is_refused(tmp_path):
    path = _facts_json(tmp_path, lambda d: d["facts"].pop("head_dim"))
    with pytest.raises(FactsError, match="head_dim"):
        load_facts(path)


# -------------------------------------------------------------- live models


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2", "gpt2"])
def test_live_tiny_model_has_the_fingerprint_of_its_config(family):
    pytest.importorskip("transformers")
    from tiny_models import SHARED, tiny_model

    from steerc.runtime.hf import facts_from_model

    live = facts_from_model(tiny_model(family))
    cfg = load_facts(_model_dir(SHARED[family]))
    assert live == cfg
    assert live.fingerprint == cfg.fingerprint
    assert live.guesses == ()


# One small config per family (2 layers), built here so every family's site
# table is checked against real transformers modules. gemma2 gets
# heads * head_dim != hidden, like Gemma-2 2B.
LIVE_CONFIGS = {
    "llama": {"num_key_value_heads": 2},
    "mistral": {"num_key_value_heads": 2, "sliding_window": None},
    "qwen2": {"num_key_value_heads": 2},
    "qwen3": {"num_key_value_heads": 2, "head_dim": 8},
    "gemma": {"num_key_value_heads": 2, "head_dim": 8},
    "gemma2": {"num_key_value_heads": 2, "head_dim": 12, "query_pre_attn_scalar": 12},
    "gemma3_text": {"num_key_value_heads": 2, "head_dim": 12, "query_pre_attn_scalar": 12, "sliding_window": 16},
    "phi3": {"num_key_value_heads": 4, "pad_token_id": 0},
    "gpt2": {},
    "gpt_neox": {"rotary_pct": 0.25, "use_parallel_residual": True},
    "olmo2": {"num_key_value_heads": 2},
    "granite": {"num_key_value_heads": 2, "residual_multiplier": 0.5, "embedding_multiplier": 2.0},
    "cohere": {"num_key_value_heads": 2},
    "mixtral": {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                  "shared_expert_intermediate_size": 24},
    # layer 1 dense among sparse ones; heads * head_dim != hidden
    "qwen3_moe": {"num_key_value_heads": 2, "head_dim": 12, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 16, "mlp_only_layers": [1]},
    "olmoe": {"num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2},
    "gpt_oss": {"num_key_value_heads": 2, "head_dim": 12, "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 2.0,
                                    "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0}},
}


@functools.cache
def live_model(family: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _cfg(family, **LIVE_CONFIGS[family], max_position_embeddings=64)
    if family == "gpt2":
        cfg["n_positions"] = 64
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    from tiny_models import from_config

    torch.manual_seed(0)
    return from_config(config, torch.float64).eval()


def test_live_model_facts_agree_with_config_for_every_family():
    from steerc.runtime.hf import facts_from_model

    for family in FAMILIES:
        model = live_model(family)
        live = facts_from_model(model)
        assert live.family == family
        assert live == facts_from_config(model.config.to_dict())


def test_site_tables_cover_every_family_on_both_backends():
    assert set(TABLES) == {"hf", "vllm"}
    for backend in TABLES:
        assert set(TABLES[backend]) == set(FAMILIES), backend
        for family in FAMILIES:
            t = site_table(family, backend)
            assert (t.family, t.backend) == (family, backend)
            for kind in ("resid_post", "attn_out", "mlp_out", "head"):
                for layer in (0, 1, 7):
                    hook = t.hook(kind, layer)
                    assert f".{layer}" in hook.module and "{" not in hook.module
                    assert hook.kind in ("pre", "post")
            assert t.hook("resid_pre", 0).kind == "pre"
            with pytest.raises(ValueError):
                t.hook("resid_pre", 1)
    for model_type, family in MODEL_TYPES.items():
        assert family in FAMILIES and model_type in FAMILIES[family].model_types


def test_vllm_tables_name_vllm_modules():
    # vLLM fuses (hidden, residual) in the decoder layers of these families
    for family in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"):
        t = site_table(family, "vllm")
        assert t.hook("resid_post", 3).tensor == "fused_pair"
        assert t.hook("resid_pre", 0).tensor == "input1"
    assert site_table("gpt_neox", "vllm").hook("attn_out", 2).module == "model.layers.2.attention.dense"
    assert site_table("gpt_neox", "hf").hook("attn_out", 2).module == "gpt_neox.layers.2.post_attention_dropout"


def _site_values(model, table, layers=(0, 1)):
    """Run the model once, recording each hooked tensor of the hf site table."""
    import torch

    seen: dict[tuple[str, int], torch.Tensor] = {}
    handles = []

    def pick(value):
        return value[0] if isinstance(value, tuple) else value

    def add(kind, layer, hook):
        module = model.get_submodule(hook.module)  # raises if the module does not exist
        if hook.kind == "pre":
            def fn(mod, args, kwargs):
                seen[(kind, layer)] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
            handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
        else:
            def fn(mod, args, output):
                seen[(kind, layer)] = pick(output).detach().clone()
            handles.append(module.register_forward_hook(fn))

    add("resid_pre", 0, table.hook("resid_pre", 0))
    for layer in layers:
        for kind in ("resid_post", "attn_out", "mlp_out", "head"):
            add(kind, layer, table.hook(kind, layer))
    ids = torch.tensor([[1, 5, 7, 9, 11, 3]])
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_site_table_names_real_modules_with_the_right_tensors(family):
    """Every hook of layers 0 and 1 exists, has the site's width, and the
    residual stream is the sum of the block contributions the table names."""
    import torch

    from steerc.runtime.hf import facts_from_model

    model = live_model(family)
    facts = facts_from_model(model)
    table = site_table(family, "hf")
    assert model.get_submodule(table.layers) is not None
    assert model.get_submodule(table.final_norm) is not None
    assert len(model.get_submodule(table.layers)) == facts.layers
    seen = _site_values(model, table)
    assert set(seen) == {("resid_pre", 0)} | {(k, layer) for layer in (0, 1)
                                               for k in ("resid_post", "attn_out", "mlp_out", "head")}
    for (kind, _), value in seen.items():
        want = facts.heads * facts.head_dim if kind == "head" else facts.hidden
        assert value.shape[-1] == want, (kind, value.shape)
    pre = seen[("resid_pre", 0)]
    key = FAMILIES[family].residual_scale_key  # Granite scales both block outputs in the add
    scale = model.config.to_dict()[key] if key else 1.0
    for layer in (0, 1):
        post = seen[("resid_post", layer)]
        total = pre + scale * (seen[("attn_out", layer)] + seen[("mlp_out", layer)])
        assert torch.allclose(post, total, atol=1e-9), f"{family} layer {layer}: resid_post != pre + attn + mlp"
        pre = post


def test_gemma2_head_site_is_wider_or_narrower_than_hidden():
    from steerc.runtime.hf import facts_from_model

    facts = facts_from_model(live_model("gemma2"))
    assert facts.heads * facts.head_dim == 48 != facts.hidden == 32
    o_proj = live_model("gemma2").get_submodule(site_table("gemma2", "hf").hook("head", 1).module)
    assert o_proj.in_features == 48


# ------------------------------------------------------------ unknown family


@pytest.fixture
def unknown_config(tmp_path):
    cfg = {"architectures": ["BertModel"], "hidden_size": 64, "model_type": "bert", "num_hidden_layers": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return tmp_path


def _model_type_line(folder) -> int:
    lines = (folder / "config.json").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if '"model_type"' in line)


def test_unknown_family_is_a_diagnostic_with_a_caret(unknown_config, monkeypatch):
    with pytest.raises(FactsError) as info:
        load_facts(str(unknown_config))
    assert info.value.code == "unknown-family"
    monkeypatch.chdir(EXAMPLES)
    code, _out, err = run_cli(["check", "02_abliterate.steer", "--model", str(unknown_config)])
    assert code == 1
    assert "error[unknown-family]" in err and "`bert`" in err
    for family in FAMILIES:
        assert family in err
    line = _model_type_line(unknown_config)
    assert f"config.json:{line}:" in err
    rendered = err.splitlines()
    at = next(i for i, ln in enumerate(rendered) if ln.startswith(f"{line} |"))
    src_line, caret_line = rendered[at], rendered[at + 1]
    assert '"model_type": "bert"' in src_line
    col = src_line.index('"bert"')
    assert caret_line.index("^") == col and caret_line.count("^") == len('"bert"')


def test_unknown_family_as_json_under_check(unknown_config, monkeypatch):
    monkeypatch.chdir(EXAMPLES)
    code, out, _err = run_cli(["check", "--format", "json", "02_abliterate.steer", "--model",
                              str(unknown_config / "config.json")])
    assert code == 1
    doc = json.loads(out)
    (d,) = doc["diagnostics"]
    assert d["code"] == "unknown-family" and d["severity"] == "error"
    assert d["file"].endswith("config.json") and d["line"] == _model_type_line(unknown_config)
    assert d["end_column"] - d["column"] == len('"bert"')
    assert all(f in d["message"] for f in FAMILIES)
    assert doc["errors"] == 1


@pytest.mark.parametrize("command", [["facts"], ["explain", "02_abliterate.steer", "--model"]])
def test_unknown_family_exits_1_for_facts_and_explain(unknown_config, monkeypatch, command):
    monkeypatch.chdir(EXAMPLES)
    code, _, err = run_cli([*command, str(unknown_config)])
    assert code == 1 and "unknown-family" in err


def test_unknown_family_in_facts_json(tmp_path):
    path = _facts_json(tmp_path, lambda d: d["facts"].update(family="bert", fingerprint=None))
    with pytest.raises(FactsError) as info:
        load_facts(path)
    assert info.value.code == "unknown-family"


def test_unreadable_model_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLES)
    assert run_cli(["check", "02_abliterate.steer", "--model", str(tmp_path)])[0] == 2  # no config.json
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    assert run_cli(["check", "02_abliterate.steer", "--model", str(tmp_path)])[0] == 2


def test_discover_guesses_the_layout_of_an_unknown_live_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from steerc.runtime.hf import discover, facts_from_model

    config = transformers.AutoConfig.for_model(
        "phi", hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, vocab_size=100,
        max_position_embeddings=64)
    assert config.model_type not in MODEL_TYPES
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    facts = discover(model, config.to_dict())
    assert facts.origin == "discovered" and facts.family == "phi"
    assert (facts.layers, facts.hidden, facts.heads, facts.head_dim) == (3, 32, 4, 8)
    assert facts.guesses, "discovery must say what it guessed"
    text = " ".join(facts.guesses)
    assert "model.layers" in text and "3" in text  # where the layers are and how many
    assert "hidden size 32" in text and "4 heads" in text
    assert "site tables are unknown" in text
    assert facts_from_model(model) == facts


# A config.json may leave out keys whose transformers default is not the
# "obvious" one; facts from the file must still be the facts of the model
# transformers builds from it (else a plan checked against the file is refused
# by install(), and head-site widths are wrong).


def _omission_cases():
    for family in sorted(set(FAMILIES) - {"gpt2"}):
        for key in ("head_dim", "num_key_value_heads"):
            yield pytest.param(family, key, id=f"{family}-no-{key}")


@pytest.mark.parametrize("family,omitted", list(_omission_cases()))
def test_config_json_with_a_key_left_out_has_the_facts_of_the_model_built_from_it(family, omitted):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from steerc.runtime.hf import facts_from_model

    raw = _cfg(family, num_key_value_heads=2, head_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=1,
               max_position_embeddings=64)
    raw.pop(omitted)
    model_type = raw["model_type"]
    config = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    from_file = facts_from_config(raw)
    live = facts_from_model(model)
    assert {k: getattr(from_file, k) for k in FACT_FIELDS} == {k: getattr(live, k) for k in FACT_FIELDS}
