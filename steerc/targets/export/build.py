"""Build the export target's artifacts (torch, transformers): the steered decoder, exported.

The hf target's package is written to ``OUT/hooks`` and installed on the loaded model, so the exported
graph computes with the very kernels the hf target runs (``_support.py`` and ``_hooks.py``). A wrapper module holds a static
KV cache and the program's tensors as registered buffers, and takes what a step needs to keep scopes,
schedules and per-token gates meaning what they mean in ``generate``:

``forward(input_ids [1, T], position_ids [1, T], prompt_len [1]) -> logits [1, T, vocab]``

``position_ids`` are the tokens' positions in the sequence (also where they go in the cache: a prefill at
0..T-1, then one decode step at a time), ``prompt_len`` the prompt's length (the same for every step of one
sequence). ``torch.export.export`` (non-strict) traces it with a dynamic ``T``; the steering tensors are
buffers of the exported program, not constants, so its ``state_dict`` can take new values. A prompt-pooled
probe's value is a buffer too: the call that holds the prompt's last position decides it, and the decode
steps after it read it (prefill the prompt in one call, as ``generate`` does).

Written: ``program.pt2`` (``torch.export.save``, loaded by ``torch.export.load`` without steerc; its sample
inputs, a pickle, are left out), ``model.aoti.pt2`` (the same program compiled by AOTInductor, loaded by
``torch._inductor.aoti_load_package``), ``steer.json`` (the signature, the buffers, provenance) and
``hooks/`` (the hf package it was built from).
"""

from __future__ import annotations

import json
import os
import zipfile

FORMAT = "steerc.export/1"
MAX_LEN = 512  # the static cache's length: a prompt and its completion together


class ExportError(ValueError):
    """What the export target cannot build (the message says why)."""


def build(plan, facts, out_dir: str, command: str, load) -> list[str]:
    import torch

    from steerc.targets.hf.emit import emit as write_package
    from steerc.targets.hf.emit import import_package
    from steerc.targets.hooks import lower_hf

    if load is None:
        raise ExportError("--target export builds from the model's weights: give --model a model folder or file")
    model = load()
    program = lower_hf(plan, facts)
    os.makedirs(out_dir, exist_ok=True)
    folder = os.path.join(out_dir, "hooks")
    hooks = [f"hooks/{n}" for n in write_package(program, folder, command)]
    package = import_package(folder, "steerc_export_" + os.path.basename(os.path.abspath(out_dir)).replace("-", "_"))
    handle = package.install(model)
    steered = None
    try:
        handle.warm_up()  # every planned hook runs: checked eagerly, before tracing
        pooled = sorted({p.name for h in program.hooks for site in h.sites for p in site.probes if p.pool != "token"})
        steered = Steered(model, handle.context, package._T, pooled, package.S.compute_dtype)
        ids = torch.tensor([[1, 2, 3, 4]])
        length = torch.export.Dim("tokens", min=1, max=MAX_LEN - 1)
        exported = torch.export.export(
            steered, (ids, torch.arange(4).unsqueeze(0), torch.tensor([4])),
            dynamic_shapes={"input_ids": {1: length}, "position_ids": {1: length}, "prompt_len": None},
            strict=False)
    finally:
        handle.remove()
    program_path = os.path.join(out_dir, "program.pt2")
    _save_program(exported, program_path)
    written = ["program.pt2", "steer.json", *hooks]
    aoti = os.path.join(out_dir, "model.aoti.pt2")
    torch._inductor.aoti_compile_and_package(exported, package_path=aoti)
    written.append("model.aoti.pt2")
    info = {
        "format": FORMAT,
        "command": command,
        "source_sha256": plan.source_sha256,
        "facts": facts.to_json(),
        "torch": torch.__version__,
        "inputs": {"input_ids": "int64 [1, T]", "position_ids": "int64 [1, T]: each token's position",
                   "prompt_len": "int64 [1]: the prompt's length"},
        "output": "logits [1, T, vocab]",
        "max_len": MAX_LEN,
        "buffers": dict(sorted(steered.names.items())),
        "files": {"program.pt2": "torch.export.load", "model.aoti.pt2": "torch._inductor.aoti_load_package"},
    }
    with open(os.path.join(out_dir, "steer.json"), "w", encoding="utf-8") as fh:
        json.dump(info, fh, indent=2, sort_keys=True)
        fh.write("\n")
    return sorted(written)


def _save_program(exported, path: str) -> None:
    """``torch.export.save``, without the archive's sample inputs (a pickle): saved under its own name in a
    temporary folder (the archive's entries are named after the file) and copied entry by entry, the sample
    inputs' entry left empty (``torch.export.load`` reads an empty one as none). Same program, same bytes."""
    import shutil
    import tempfile

    import torch

    folder = tempfile.mkdtemp(prefix=".export-", dir=os.path.dirname(path))
    try:
        tmp = os.path.join(folder, os.path.basename(path))
        torch.export.save(exported, tmp)
        with zipfile.ZipFile(tmp) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
            for entry in src.infolist():
                empty = "/data/sample_inputs/" in entry.filename
                dst.writestr(entry, b"" if empty else src.read(entry.filename))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _steered_class():
    import torch

    class Steered(torch.nn.Module):
        """The model with its static cache and the steering tensors as buffers."""

        def __init__(self, model, context, tensors, pooled, compute_dtype):
            from transformers.cache_utils import StaticCache

            super().__init__()
            self.model = model
            self.context = context
            config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
            param = next(model.parameters())
            self.cache = StaticCache(max_cache_len=MAX_LEN, config=config)
            heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            self.cache.early_initialization(1, heads, head_dim, param.dtype, param.device)
            for i, layer in enumerate(self.cache.layers):
                self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
                self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
                self.register_buffer(f"cumulative_length_{i}", layer.cumulative_length, persistent=False)
            # the steering tensors: buffers, read through the module, so the export lifts them as buffers
            self.names = {}
            for i, name in enumerate(sorted(tensors._base)):
                self.register_buffer(f"steer_{i}", tensors._base[name].clone())
                self.names[name] = f"steer_{i}"
            tensors._base = _Buffers(self, self.names)
            tensors._cache = {}
            # a prompt-pooled probe's value, decided by the prefill, read by the decode steps that follow
            self.pooled = {name: f"held_{i}" for i, name in enumerate(pooled)}
            for name, buffer in self.pooled.items():
                self.register_buffer(buffer, torch.full((1,), float("nan"), dtype=compute_dtype(param.dtype),
                                                        device=param.device))

        def forward(self, input_ids, position_ids, prompt_len):
            for i, layer in enumerate(self.cache.layers):  # the cache reads its buffers through the module
                layer.keys = getattr(self, f"key_cache_{i}")
                layer.values = getattr(self, f"value_cache_{i}")
                layer.cumulative_length = getattr(self, f"cumulative_length_{i}")
                layer.cumulative_length.copy_(position_ids[0, 0])
            self.context.forced_prompt_len = prompt_len
            self.context.carried_held = {name: getattr(self, b) for name, b in self.pooled.items()}
            out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, cache=self.cache,
                             use_cache=True)
            for name, buffer in self.pooled.items():
                getattr(self, buffer).copy_(self.context.held[name])
            return out.logits

    return Steered


class _Buffers:
    """A read-only view of a module's buffers by tensor name, read at call time (so a traced call reads
    the traced buffer)."""

    def __init__(self, module, names: dict):
        self.module, self.names = module, names

    def __getitem__(self, name: str):
        return getattr(self.module, self.names[name])

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


def Steered(model, context, tensors, pooled, compute_dtype):  # noqa: N802 - the class, built on first use
    return _steered_class()(model, context, tensors, pooled, compute_dtype)
