"""Helpers for the HF runtime tests: programs, captures and a direct computation."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from steerc.api import Options, check_source
from steerc.facts.sites import site_table
from steerc.ir.interpret import apply_kernel
from steerc.runtime.hf import facts_from_model


def vec(width: int, seed: int, scale: float = 1.0) -> str:
    """An inline vector literal of ``width`` seeded values."""
    rng = np.random.default_rng(seed)
    return "[" + ", ".join(f"{x:.6f}" for x in rng.normal(0.0, scale, width)) + "]"


def plan_for(model, text: str, base_dir: str | None = None, name: str = "test.steer"):
    facts = facts_from_model(model)
    result = check_source(text, name, options=Options(base_dir=base_dir, root=base_dir), facts=facts)
    assert result.ok, result.render()
    return result.plan


def hook_of(model, site):
    table = site_table(facts_from_model(model).family, "hf")
    return table.hook(site.kind, site.layer)


@contextlib.contextmanager
def capture(model, hook, store: list):
    """Record the site tensor seen *after* any steering hook on the same module."""
    module = model.get_submodule(hook.module)
    if hook.kind == "pre":
        def pre(mod, args, kwargs):
            store.append((args[0] if args else kwargs["hidden_states"]).detach().clone())

        h = module.register_forward_pre_hook(pre, with_kwargs=True)
    else:
        def post(mod, args, output):
            store.append((output[0] if isinstance(output, tuple) else output).detach().clone())

        h = module.register_forward_hook(post)
    try:
        yield store
    finally:
        h.remove()


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Per-row positions counted from the first real token (-1 on padding)."""
    out = torch.full_like(mask, -1)
    for b in range(mask.shape[0]):
        n = 0
        for t in range(mask.shape[1]):
            if mask[b, t]:
                out[b, t] = n
                n += 1
    return out


def expected_site(site_plan, h: torch.Tensor, mask_of, columns=None) -> torch.Tensor:
    """The direct computation: steerc.ir.interpret applied row by row on captured h."""
    out = h.clone().double()
    for b in range(h.shape[0]):
        x = out[b].numpy().copy()
        part = x[:, columns[0]:columns[1]] if columns else x
        for k in site_plan.kernels:
            part = apply_kernel(k, part, mask_of(k, b))
        if columns:
            x[:, columns[0]:columns[1]] = part
        else:
            x = part
        out[b] = torch.from_numpy(x)
    return out


def scoped(mask: torch.Tensor, scope: str, gate_values=None):
    """``mask_of(kernel, b)`` for :func:`expected_site`: the real positions of row ``b`` that ``scope`` selects
    (``all``, ``[0, 2]``, ``prompt[-2:]`` or ``prompt[1:]``, every prompt real), and where ``gate_values``
    ([rows, positions]) is given, those where it is above 0 (a gate ``when p > 0``)."""
    pos = positions(mask).numpy()
    real = mask.bool().numpy()

    def mask_of(kernel, b):
        p = pos[b]
        m = real[b].copy()
        if scope == "[0, 2]":
            m &= np.isin(p, [0, 2])
        elif scope == "prompt[-2:]":
            m &= p >= real[b].sum() - 2
        elif scope == "prompt[1:]":
            m &= p >= 1
        if gate_values is not None:
            m &= gate_values[b] > 0.0
        return m

    return mask_of


def exported_and_runtime(root, text: str):
    """``text`` as ``root/p.steer``, compiled with ``--target export`` against ``root/model`` (the working
    folder is ``root``): the exported program's logits on a prompt, the in-process runtime's and the unsteered
    model's, and the names of the export's buffers."""
    import json

    from support import run_cli
    from transformers import AutoModelForCausalLM

    from steerc.runtime.hf import install

    (root / "p.steer").write_text(text)
    code, _, err = run_cli(["compile", "p.steer", "--model", "model", "--target", "export", "-o", "out"])
    assert code == 0, err[-3000:]
    buffers = json.loads((root / "out" / "steer.json").read_text())["buffers"]
    prompt = torch.tensor([[3, 4, 5, 6, 7, 8]])
    exported = torch.export.load(str(root / "out" / "program.pt2")).module()
    with torch.no_grad():
        got = exported(prompt, torch.arange(6).unsqueeze(0), torch.tensor([6]))[0]
    model = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32).eval()
    with torch.no_grad():
        plain = model(input_ids=prompt).logits[0]
        with install(model, plan_for(model, text, base_dir=str(root))):
            want = model(input_ids=prompt).logits[0]
    return got, want, plain, {name.rsplit(".", 1)[-1] for name in buffers}


def load_emitted(path: str, name: str):
    """Import an emitted package from ``path`` under a unique module name."""
    from steerc.targets.hf.emit import import_package

    return import_package(path, name)


def count_hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
