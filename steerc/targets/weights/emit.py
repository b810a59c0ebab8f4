"""``steerc compile --target weights -o OUT``: a Hugging Face model folder with the program folded into it.

OUT holds ``config.json`` (the model's, with the bias and tying switches the fold needs), the weights
(``model.safetensors``, or shards and their index past :data:`MAX_SHARD_BYTES`), the model's tokenizer and
generation files as they are, and ``steerc.json`` (the program's hash, the model's fingerprint, and what
was folded where). Tensors the program does not touch are copied bit for bit; the same program and model
give the same bytes.
"""

from __future__ import annotations

import json
import os

from steerc.core.paths import write_atomically
from steerc.targets.weights import layout
from steerc.targets.weights.tensors import (
    Out,
    Reader,
    WeightsError,
    index_bytes,
    plan_shards,
    shard_names,
    tensor_out,
    write_file,
)

FORMAT = "steerc.weights/1"
MAX_SHARD_BYTES = 5 * 10**9  # transformers' own default past which it shards
# Copied as they are: what transformers and vLLM read beside the weights.
COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
          "chat_template.json")
MAX_COPIED_BYTES = 256 << 20


def emit(plan, facts, out_dir: str, command: str = "", model=None) -> list[str]:
    """Write the folder; returns the names written, relative to ``out_dir``. ``model`` gives the weights
    (``model.safetensors_folder()``: a folder of safetensors, a .gguf's dequantized copy). A checkpoint it
    cannot read, or a file of the user's in the way, is a :class:`~steerc.diagnostics.Refusal`."""
    from steerc.diagnostics import Diagnostic, Refusal

    try:
        if model is None or not hasattr(model, "safetensors_folder"):
            raise WeightsError("--target weights reads the model's weights itself; it was given none")
        folder = model.safetensors_folder()
        if not os.path.isdir(folder):
            raise WeightsError(f"{folder}: the weights target reads a folder of safetensors (a .gguf's dequantized "
                               "copy is kept in steerc's cache, which could not be written)")
        return _emit(plan, facts, folder, out_dir, command)
    except WeightsError as exc:
        raise Refusal([Diagnostic.error(exc.code, f"--target weights: {exc}", None, help=exc.help)]) from None


def _emit(plan, facts, folder: str, out_dir: str, command: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    config = _config(folder)
    reader = Reader(folder)
    written: list[str] = []
    try:
        outs, changes, record = _tensors(plan, facts, reader, config)
        shards = plan_shards(outs, MAX_SHARD_BYTES)
        names = shard_names(len(shards))
        copied = [n for n in COPIED if os.path.isfile(os.path.join(folder, n))
                  and os.path.getsize(os.path.join(folder, n)) <= MAX_COPIED_BYTES]
        _theirs(out_dir, [*names, *(["model.safetensors.index.json"] if len(names) > 1 else []), "config.json",
                          *copied, "steerc.json"])
        for shard, name in zip(shards, names):
            write_file(os.path.join(out_dir, name), shard)
            written.append(name)
    except BaseException:
        for name in written:  # a failed compile leaves none of its files behind
            os.unlink(os.path.join(out_dir, name))
        raise
    finally:
        reader.close()
    blobs = {}
    if len(names) > 1:
        blobs["model.safetensors.index.json"] = index_bytes(shards, names)
    config.update(changes)
    blobs["config.json"] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")
    for name in copied:
        with open(os.path.join(folder, name), "rb") as fh:
            blobs[name] = fh.read()
    blobs["steerc.json"] = _manifest(plan, facts, command, changes, record)
    for name, data in blobs.items():
        write_atomically(os.path.join(out_dir, name), data)
    return written + list(blobs)


def _theirs(out_dir: str, names: list[str]) -> None:
    """Refuse, before writing anything, a name this compile writes that is already in OUT: what is left there
    after the last compile's own files were removed is the user's (a file they added, or changed since)."""
    from steerc.diagnostics.codes import INVALID_VALUE

    there = [n for n in names if os.path.lexists(os.path.join(out_dir, n))]
    if there:
        raise WeightsError(f"{os.path.join(out_dir, there[0])} is not a file steerc wrote as it is now (added or "
                           "changed since the last compile), and this compile would replace it",
                           code=INVALID_VALUE, help="move it away first, or give -o a new folder")


def _config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError) as exc:
        raise WeightsError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise WeightsError(f"{path} is not a JSON object")
    config.pop("quantization_config", None)  # the folded weights are plain tensors
    return config


def _tensors(plan, facts, reader: Reader, config: dict):
    """(every tensor to write, the config changes, what was folded where)."""
    folds = layout.folds(plan, facts)
    family = layout.FAMILIES[facts.family]
    rewritten: dict[str, Out] = {}
    changes: dict = {}
    zeros: dict = {}
    record = []
    for f in folds:
        weight_name = f"{f.module}.weight"
        if weight_name not in reader.entries:
            raise WeightsError(f"the checkpoint has no {weight_name}, which the {facts.family} layout names")
        weight = reader.tensor(weight_name)
        if f.module == layout.EMBED:
            from steerc.targets.weights.fold import rows

            (sp,) = f.sites
            rewritten[weight_name] = tensor_out(weight_name, rows(weight, [k.op for k in sp.kernels]))
            lm_head = f"{layout.LM_HEAD}.weight"
            if lm_head not in reader.entries:  # tied: the output layer keeps the original rows
                rewritten[lm_head] = Out(lm_head, reader.entries[weight_name].dtype,
                                         reader.entries[weight_name].shape, reader.entries[weight_name].nbytes,
                                         lambda fh, n=weight_name: reader.copy(n, fh))
                changes["tie_word_embeddings"] = False
            record.append(_record(f, weight_name, None, untied=lm_head not in reader.entries))
            continue
        from steerc.targets.weights.fold import fold_linear

        bias_name = f"{f.module}.bias"
        bias = reader.tensor(bias_name) if bias_name in reader.entries else None
        new_weight, new_bias = fold_linear(weight, bias, f.sites, facts.head_dim)
        rewritten[weight_name] = tensor_out(weight_name, new_weight)
        if new_bias is not None:
            rewritten[bias_name] = tensor_out(bias_name, new_bias)
            if bias is None:
                key, more = _bias_slot(f.module, family, config, facts, reader, weight.dtype)
                changes[key] = True
                zeros.update(more)
        record.append(_record(f, weight_name, bias_name if new_bias is not None else None))
    outs = dict(rewritten)
    for name, e in reader.entries.items():
        if name not in outs:
            outs[name] = Out(name, e.dtype, e.shape, e.nbytes, lambda fh, n=name: reader.copy(n, fh))
    for name, tensor in zeros.items():
        outs.setdefault(name, tensor_out(name, tensor))
    return list(outs.values()), changes, record


def _bias_slot(module: str, family, config: dict, facts, reader: Reader, dtype) -> tuple[str, dict]:
    """(the config switch that gives ``module`` a bias, and zero biases for every matrix it switches on that has
    none (in every layer: the switch is the whole model's))."""
    import torch

    mlp = module.endswith("down_proj")
    key = family.mlp_bias if mlp else family.attn_bias
    if key is None:  # the check refuses this first
        raise WeightsError(f"the {family.name} family has no bias on {module}")
    widths = {"hidden": facts.hidden, "q": facts.heads * facts.head_dim, "kv": facts.kv_heads * facts.head_dim,
              "intermediate": facts.intermediate}
    slots = layout.MLP_SLOT if mlp else layout.ATTN_SLOT
    part = "mlp" if mlp else "self_attn"
    zeros = {}
    if not config.get(key):
        for layer in range(facts.layers):
            for proj, width in slots.items():
                name = f"model.layers.{layer}.{part}.{proj}.bias"
                if name not in reader.entries:
                    zeros[name] = torch.zeros(widths[width], dtype=dtype)
    return key, zeros


def _record(f, weight: str, bias: str | None, untied: bool = False) -> dict:
    out = {"matrix": weight, "bias": bias,
           "sites": [{"site": sp.site.text,
                      "interventions": sorted({n for k in sp.kernels for n in k.names}),
                      "kernels": [_kernel(k.op) for k in sp.kernels]} for sp in f.sites]}
    if untied:
        out["untied"] = f"{layout.LM_HEAD}.weight"
    return out


def _kernel(op) -> dict:
    from steerc.ir.kernels import kind_of

    kind = kind_of(op)
    return kind.explain(op, lambda x: f"{x:.6g}")


def _manifest(plan, facts, command: str, changes: dict, record: list) -> bytes:
    from steerc import __version__

    doc = {
        "format": FORMAT,
        "steerc": __version__,
        "source_sha256": plan.source_sha256,
        "facts_fingerprint": plan.facts_fingerprint,
        "family": facts.family,
        "command": command,
        "config_changes": {k: v for k, v in sorted(changes.items())},
        "folds": record,
    }
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")
