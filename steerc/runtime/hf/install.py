"""The HF runtime's hooks: a plan's kernels on a transformers model's modules, and its layout facts.

The API is :mod:`steerc.runtime.hf` (this folder's ``__init__``)."""

from __future__ import annotations

import torch

from steerc.api import check_file, check_source
from steerc.core.jsonio import JSONError, loads
from steerc.facts import FORMAT, FactsError, ModelFacts, facts_from_config
from steerc.facts.sites import TABLES, SiteTable, hf_table
from steerc.ir.kernels import KINDS
from steerc.ir.plan import rebind
from steerc.runtime import hooks as H
from steerc.runtime import kernels as S
from steerc.targets.hooks import HookCode, HookProgram, KernelCall, lower_hf


class SteerInstallError(RuntimeError):
    """The plan cannot be installed on this model (wrong model, missing module)."""


# -------------------------------------------------------------------- facts


def facts_from_model(model):
    """ModelFacts of a live model: from its config, else a best-effort discovery."""
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)
    try:
        return facts_from_config(config, origin="live model")
    except FactsError as exc:
        if exc.code != "unknown-family":
            raise
        return discover(model, config)


def _largest_module_list(model):
    """(path, module) of the longest non-empty ModuleList, the decoder layers of any family, else (None, None)."""
    layers_path, layers = None, None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0 and (layers is None or len(module) > len(layers)):
            layers_path, layers = name, module
    return layers_path, layers


def discover(model, config: dict):
    """Guess the layout of an unknown family; the facts say what was guessed."""
    layers_path, layers = _largest_module_list(model)
    hidden = config.get("hidden_size") or config.get("n_embd") or config.get("d_model")
    heads = config.get("num_attention_heads") or config.get("n_head") or 1
    guesses = (
        f"decoder layers: {layers_path} ({len(layers) if layers is not None else 0} of them), the largest ModuleList",
        f"hidden size {hidden} and {heads} heads from the config",
        "site tables are unknown for this family: only the facts are usable, not hooks",
    )
    return ModelFacts(
        family=config.get("model_type", "unknown"), layers=len(layers) if layers is not None else 0,
        hidden=int(hidden or 0), heads=int(heads), kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or (int(hidden or 0) // int(heads))),
        intermediate=int(config.get("intermediate_size") or 0), vocab=int(config.get("vocab_size") or 0),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)), parallel_residual=False,
        model_type=config.get("model_type", ""), origin="discovered", guesses=guesses,
    )


CONFIRM = "confirmed"


def _child(module, names):
    """The first of ``names`` that ``module`` has as a direct child, else None."""
    children = dict(module.named_children())
    return next((n for n in names if n in children), None)


def guess_sites(model) -> dict:
    """A site table (the ``sites`` of a facts file) guessed from the module names of a family steerc has none
    for: the largest ModuleList is the decoder layers; in a layer, the attention, its output projection
    (whose input is the concatenated heads) and the MLP are found by their usual names."""
    root, layers = _largest_module_list(model)
    if root is None:
        raise SteerInstallError("no decoder layers found (no ModuleList in the model): write the facts file by hand")
    layer = layers[0]
    attn = _child(layer, ("self_attn", "attn", "attention", "self_attention"))
    mlp = _child(layer, ("mlp", "feed_forward", "ffn", "block_sparse_moe"))
    proj = _child(layer.get_submodule(attn), ("o_proj", "out_proj", "dense", "c_proj")) if attn else None
    base = root.rsplit(".", 1)[0] if "." in root else ""
    base_module = model.get_submodule(base) if base else model
    norm = _child(base_module, ("norm", "ln_f", "final_layer_norm", "final_layernorm"))

    unknown = "?"  # where a name was not found: the user fills it in before confirming
    table = hf_table(
        facts_from_model(model).family, root, attn or unknown, mlp or unknown,
        f"{attn}.{proj}" if attn and proj else unknown, f"{base + '.' if base else ''}{norm or unknown}",
        [("attn_out and mlp_out are the modules' outputs: check that they are what the layer adds to the "
          "residual stream (no norm or scale after them)")],
        read_from="guessed by steerc.runtime.hf.guess_sites from the module names; check each path")
    return table.to_json()


def write_facts(model, path: str) -> dict:
    """Write a facts file for a family steerc has no site table for: the discovered facts and the guessed
    site table, ``"confirmed": false``. Check every module path against ``print(model)``, fix what is wrong,
    set ``"confirmed": true``, then ``install(model, plan, facts=path)``."""
    import json


    facts = facts_from_model(model)
    doc = {"format": FORMAT, "facts": facts.to_json(), "backend": "hf", "sites": guess_sites(model),
           "guesses": list(facts.guesses), CONFIRM: False}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    return doc


def _how_to_confirm(family: str) -> str:
    return (f"steerc has no hf site table for the `{family}` family, and it does not place hooks on guessed module "
            f"paths. Write a facts file: steerc.runtime.hf.write_facts(model, \"{family}.facts.json\") writes the "
            "discovered facts and guessed paths; check each path against print(model), set \"confirmed\": true, "
            f"and pass it: install(model, plan, facts=\"{family}.facts.json\")")


def confirmed_table(model, path: str):
    """The site table of a confirmed facts file, checked against the live model."""
    facts = facts_from_model(model)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = loads(fh.read())
    except (OSError, UnicodeDecodeError, JSONError) as exc:
        raise SteerInstallError(f"cannot read the facts file {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("backend") != "hf" or "sites" not in doc:
        raise SteerInstallError(f"{path} is not a facts file with an hf site table (\"backend\": \"hf\", \"sites\")")
    if doc.get(CONFIRM) is not True:
        raise SteerInstallError(f"{path} is not confirmed: check each module path of its `sites` against "
                                "print(model), then set \"confirmed\": true")
    recorded = doc.get("facts") if isinstance(doc.get("facts"), dict) else {}
    if recorded.get("fingerprint") != facts.fingerprint:
        raise SteerInstallError(f"{path} describes another model (fingerprint {str(recorded.get('fingerprint'))[:12]}"
                                f"..., this {facts.family} model's is {facts.fingerprint[:12]}...)")
    try:
        table = SiteTable.from_json(facts.family, "hf", doc["sites"])
    except ValueError as exc:
        raise SteerInstallError(f"{path}: {exc}") from None
    for kind in ("resid_post", "attn_out", "mlp_out", "head"):
        for layer in range(facts.layers):
            module = table.hook(kind, layer).module
            try:
                model.get_submodule(module)
            except AttributeError:
                raise SteerInstallError(f"{path}: `sites.{kind}[l]` names {module}, which this model does not "
                                        "have (print(model) shows its modules)") from None
    return table


def compile_for(path_or_text, model, *, name: str | None = None, options=None):
    """Check a program against a live model's facts and return its plan (raises on errors)."""
    import os


    facts = facts_from_model(model)
    if isinstance(path_or_text, str) and os.path.isfile(path_or_text):
        result = check_file(path_or_text, options=options, facts=facts)
    else:
        result = check_source(path_or_text, name or "<string>", options=options, facts=facts)
    if not result.ok:
        raise ValueError("the program has errors:\n" + result.render())
    return result.plan


# ---------------------------------------------------------------- interpreter


def _kernel(call: KernelCall, x, ctx, tensors: S.Tensors):
    m = ctx.scope_mask(call.scope)
    if call.gate is not None:
        m = m & ctx.gate_mask(call.gate)
    o = {role: tensors.get(name, x) for role, name in call.tensors if role != "schedule"}
    o.update(call.numbers)
    if call.schedule:
        o["factor"] = S.schedule_factor(call.schedule, tensors.get(call.tensor("schedule"), x), ctx.pos, ctx.plen)
    return S.steer(KINDS[call.kind].maths, x, o, call.mode, m, call.preserve_norm)


def _site_fn(hook: HookCode, tensors: S.Tensors):
    has_heads = any(s.columns is not None for s in hook.sites)

    def fn(h, ctx):
        x = h.to(S.compute_dtype(h.dtype), copy=has_heads)
        for site in hook.sites:
            if site.columns is not None:
                lo, hi = site.columns
                part = x[..., lo:hi]
            else:
                part = x
            for p in site.probes:
                vec = tensors.get(p.tensor, part) if p.tensor is not None else None
                ctx.record_probe(p.name, p.pool, p.kind, part, vec, p.bias, p.threshold)
            for k in site.kernels:
                part = _kernel(k, part, ctx, tensors)
            if site.columns is not None:
                x[..., lo:hi] = part
            else:
                x = part
        return x.to(h.dtype)

    return fn


def check_model(model, fingerprint: str, facts: dict) -> None:
    live = facts_from_model(model)
    if live.fingerprint != fingerprint:
        diff = [f"{k}: plan {facts[k]!r}, model {getattr(live, k)!r}"
                for k in facts if k != "fingerprint" and getattr(live, k, None) != facts[k]]
        raise SteerInstallError("this steering was compiled for another model (" + "; ".join(diff) + ")")


def install_program(model, program: HookProgram, tokenizer=None, *, check: bool = True) -> H.Handle:
    if check:
        check_model(model, program.fingerprint, program.facts)
    tensors = S.Tensors({k: torch.from_numpy(v.copy()) for k, v in program.tensors.items()})
    hooks = [(h.module, h.kind, h.tensor, _site_fn(h, tensors)) for h in program.hooks]
    if (program.after_texts or program.constraint is not None) and tokenizer is None:
        what = 'scopes tokens `after "..."`' if program.after_texts else "constrains its output"
        raise SteerInstallError(f"this program {what}: pass the tokenizer to install()")
    constraint = None
    if program.constraint_data is not None:
        constraint = H.constraint_factory(tokenizer, model.config.vocab_size, program.constraint_data)
    context = H.Context(tokenizer, program.after_texts, constraint)
    try:
        return H.install(model, program.base_path, hooks, context, family=program.facts.get("family", "?"))
    except AttributeError as exc:
        raise SteerInstallError(f"the model has no module the plan hooks: {exc}") from None


def install(model, plan, tokenizer=None, *, check: bool = True, params=None, facts: str | None = None) -> H.Handle:
    """Install a plan's steering on ``model``; returns a removable handle (also a context manager).

    ``facts`` is a confirmed facts file (:func:`write_facts`), for a family
    steerc has no site table for; without one such a model is refused, with
    how to write it.

    ``params`` gives values to the plan's per-request params (``param ... per
    request``; the others keep their compiled defaults): the same kernels as a
    program compiled with ``--set`` to those values. A name the plan does not
    declare, or a value that is not a number in the declared range, raises
    :class:`~steerc.ir.plan.ParamError` naming the param.
    """
    plan = rebind(plan, params)
    live = facts_from_model(model)
    if check and live.fingerprint != plan.facts_fingerprint:
        raise SteerInstallError(
            f"this plan was compiled for a model with fingerprint {plan.facts_fingerprint[:12]}..., "
            f"not this {live.family} model ({live.fingerprint[:12]}...)"
        )
    table = None
    if facts is not None:
        table = confirmed_table(model, facts)
    elif live.family not in TABLES["hf"]:
        guesses = "; ".join(live.guesses)
        raise SteerInstallError(_how_to_confirm(live.family) + (f" (discovered: {guesses})" if guesses else ""))
    program = lower_hf(plan, live, table)
    return install_program(model, program, tokenizer, check=False)
