"""Neuronpedia's steering requests, imported: ``steerc import request.json --sae-root DIR``.

Neuronpedia steers a model with SAE features named by its ids: a feature is ``model/source/index`` (the
SAE set ``model/source`` is what a SAELens folder's ``cfg.json`` carries as ``metadata.neuronpedia_id``).
A steering request — the public API's ``POST /api/steer`` body (features as ``{"modelId", "layer", "index",
"strength"}``) or its inference server's ``/steer/completion`` body (``{"model", "source", "index",
"strength"}``) — names features, a ``strength_multiplier``, a ``steer_method`` and ``normalize_steering``,
and may give raw vectors with their TransformerLens hook instead (``vectors``: ``{"steering_vector",
"strength", "hook"}``). What its inference server computes (``neuronpedia_inference``,
``endpoints/steer/completion.py``, read 2026-12-05), for ``SIMPLE_ADDITIVE``:

* one hook is installed per feature, at that feature's SAE hook, and every one of those hooks adds **every**
  feature's vector, ``strength_multiplier * strength * W_dec[index]`` (``W_dec[index] / |W_dec[index]|``
  under ``normalize_steering``), at every position, the prompt's BOS token included;
* so a request of one feature adds its vector once at its SAE's site, and a request of n features adds the
  sum of all n at each feature's site (twice where two features share a site). The import writes exactly
  that, one intervention per feature, and says so in a comment.

The features' SAEs are found under ``--sae-root DIR``: every SAELens folder below it (at most four levels
down) whose ``cfg.json`` names the feature's set as its ``neuronpedia_id``. ``ORTHOGONAL_DECOMP`` and
``PROJECTION_CAP`` are refused (they are not an addition). The request's generation settings (prompt,
temperature, tokens, seed, ...) are not steering: they become a comment.
"""

from __future__ import annotations

import json
import math
import os

from steerc.diagnostics.codes import FILE_NOT_FOUND, INVALID_FOREIGN_FILE, UNSUPPORTED_BY_TARGET
from steerc.formats import ForeignFileError, Imported
from steerc.formats.text import comment, literal

# Steering fields, each with its alternative spellings (the public API's, the inference server's and their
# camelCase forms), and the generation settings a request carries that do not steer.
_FIELDS = {"features": ("features",), "vectors": ("vectors",),
           "strength_multiplier": ("strength_multiplier", "strengthMultiplier"),
           "steer_method": ("steer_method", "steerMethod"),
           "normalize_steering": ("normalize_steering", "normalizeSteering")}
_SETTINGS = ("prompt", "modelId", "model", "temperature", "n_tokens", "n_completion_tokens", "nTokens",
             "freq_penalty", "freqPenalty", "seed", "types", "stream", "n_logprobs", "steer_special_tokens",
             "steerSpecialTokens", "fail_if_busy", "defaultChatMessages", "steeredChatMessages")
_FEATURE = {"model": ("model", "modelId"), "source": ("source", "layer"), "index": ("index",),
            "strength": ("strength",), "steering_vector": ("steering_vector", "steeringVector")}
_VECTOR = {"steering_vector": ("steering_vector", "steeringVector"), "strength": ("strength",), "hook": ("hook",)}
MAX_FEATURES = 256
MAX_WIDTH = 1 << 16
MAX_FOLDERS = 4096  # folders looked at under --sae-root
METHODS = {"SIMPLE_ADDITIVE": None,
           "ORTHOGONAL_DECOMP": "it replaces the component along the vector (Neuronpedia's OrthogonalProjector), "
                                "which is not an addition; steerc's `clamp s[i] to c` sets such a component",
           "PROJECTION_CAP": "it caps the projection onto the vector, which is not an addition"}


def sniff(head: bytes) -> bool:
    """A JSON object whose first bytes name ``features`` or ``steer_method`` (vLLM-Hook's specs start with
    ``ops``, EasySteer's with ``vectors`` or ``conflict``)."""
    text = head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    return text.startswith("{") and any(k in text for k in ('"features"', '"steer_method"', '"steerMethod"'))


def convert(path: str, stem: str, sae_root: str | None = None, out_dir: str | None = None) -> Imported:
    from steerc.formats.vllm_hook import read_spec

    spec, source, (doc, _) = read_spec(path)
    return _Importer(path, spec, source, doc, stem, sae_root, out_dir or os.getcwd()).program()


class _Importer:
    def __init__(self, path, spec, source, doc, stem, sae_root, out_dir):
        self.path, self.spec, self.source, self.doc, self.stem = path, spec, source, doc, stem
        self.sae_root, self.out_dir = sae_root, out_dir
        self.tensors: dict[str, object] = {}
        self.saes: dict[str, tuple[str, object]] = {}  # neuronpedia id -> (declared name, SAE)
        self._index: dict[str, list[str]] | None = None  # neuronpedia id -> folders under --sae-root

    # -- reading the request
    def fail(self, ptr: str, message: str, help: str | None = None, code: str = INVALID_FOREIGN_FILE,
             key: bool = False):
        from steerc.formats.vllm_hook import span_of

        first, then = (self.doc.keys, self.doc.values) if key else (self.doc.values, self.doc.keys)
        at = first.get(ptr) or then.get(ptr)
        return ForeignFileError(code, message, help, self.source, span_of(self.source, at))

    def refuse(self, ptr: str, what: str, why: str, help: str | None = None):
        return self.fail(ptr, f"steerc cannot express {what}: {why}", help, UNSUPPORTED_BY_TARGET)

    def fields(self, value, ptr: str, table: dict, allowed: tuple = ()) -> dict:
        """``value``'s fields by their names in ``table`` (one spelling each), refusing unknown keys."""
        if not isinstance(value, dict):
            raise self.fail(ptr, f"`{ptr or '/'}` must be an object")
        out: dict = {}
        for key in value:
            name = next((n for n, spellings in table.items() if key in spellings), None)
            if name is None:
                if key in allowed:
                    continue
                raise self.fail(f"{ptr}/{key}", f"unknown field `{comment(key, 40)}` in `{ptr or '/'}` of a "
                                "Neuronpedia steering request", key=True)
            if name in out:
                raise self.fail(f"{ptr}/{key}", f"`{ptr or '/'}` gives `{name}` twice (as `{out[name][0]}` and "
                                f"`{key}`)")
            out[name] = (key, value[key])
        return out

    def number(self, value, ptr: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise self.fail(ptr, f"`{ptr}` must be a finite number")
        return float(value)

    def program(self) -> Imported:
        request = self.fields(self.spec, "", _FIELDS, _SETTINGS)
        method_key, method = request.get("steer_method", ("steer_method", "SIMPLE_ADDITIVE"))
        if not isinstance(method, str) or method not in METHODS:
            raise self.fail(f"/{method_key}", f"`steer_method` must be one of {', '.join(METHODS)}")
        if METHODS[method] is not None:
            raise self.refuse(f"/{method_key}", f"steer_method {method}", METHODS[method])
        mult_key, multiplier = request.get("strength_multiplier", ("strength_multiplier", 1.0))
        multiplier = self.number(multiplier, f"/{mult_key}")
        norm_key, normalize = request.get("normalize_steering", ("normalize_steering", False))
        if not isinstance(normalize, bool):
            raise self.fail(f"/{norm_key}", "`normalize_steering` must be true or false")
        if ("features" in request) == ("vectors" in request):
            raise self.fail("", "a steering request gives `features` or `vectors` (exactly one of them, as "
                            "Neuronpedia requires)")
        kind = "features" if "features" in request else "vectors"
        key, items = request[kind]
        if not isinstance(items, list) or not items:
            raise self.fail(f"/{key}", f"`{key}` must be a non-empty list")
        if len(items) > MAX_FEATURES:
            raise self.fail(f"/{key}", f"`{key}` holds {len(items)} entries; steerc imports at most {MAX_FEATURES}")
        terms = [self.feature(item, f"/{key}/{i}") if kind == "features" else self.vector(item, f"/{key}/{i}")
                 for i, item in enumerate(items)]
        return self.write(terms, multiplier, normalize, method)

    def feature(self, item, ptr: str) -> dict:
        f = self.fields(item, ptr, _FEATURE)
        for need in ("model", "source", "index", "strength"):
            if need not in f:
                raise self.fail(ptr, f"`{ptr}` has no `{_FEATURE[need][-1] if need != 'source' else 'layer'}` "
                                f"(a feature is {{modelId, layer, index, strength}})")
        model, source = (self.text(f[k][1], f"{ptr}/{f[k][0]}") for k in ("model", "source"))
        index = f["index"][1]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 2**31:
            raise self.fail(f"{ptr}/index", "`index` must be a feature number, 0 or more")
        strength = self.number(f["strength"][1], f"{ptr}/strength")
        if f.get("steering_vector", (None, None))[1] is not None:
            raise self.refuse(f"{ptr}/{f['steering_vector'][0]}", "a feature sent with its own steering vector",
                              "Neuronpedia's server replaces it with the SAE's decoder row", "leave it out")
        npid = f"{model}/{source}"
        name, sae = self.sae(npid, f"{ptr}/{f['source'][0]}")
        if index >= sae.d_sae:
            raise self.fail(f"{ptr}/index", f"feature {index} is out of range: `{npid}` has d_sae = {sae.d_sae:,}")
        site = sae.site
        if site is None:
            raise self.refuse(f"{ptr}/{f['source'][0]}", f"a feature of `{comment(npid, 60)}`",
                              sae.site_reason or "its SAE's hook is no steerc site")
        return {"what": f"feature {npid}/{index}", "site": site, "strength": strength,
                "operand": f"{name}[{index}]"}

    def vector(self, item, ptr: str) -> dict:
        import numpy as np

        from steerc.io.sae import site_of_hook, why_no_site

        f = self.fields(item, ptr, _VECTOR)
        for need in ("steering_vector", "strength", "hook"):
            if need not in f:
                raise self.fail(ptr, f"`{ptr}` has no `{need}` (a vector is {{steering_vector, strength, hook}})")
        hook = self.text(f["hook"][1], f"{ptr}/hook")
        site = site_of_hook(hook)
        if site is None:
            raise self.refuse(f"{ptr}/hook", f"a vector at `{comment(hook, 60)}`", why_no_site(hook) or "")
        raw = f["steering_vector"][1]
        vptr = f"{ptr}/{f['steering_vector'][0]}"
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_WIDTH:
            raise self.fail(vptr, f"`steering_vector` must be a list of 1 to {MAX_WIDTH} numbers")
        values = np.array([self.number(x, f"{vptr}/{i}") for i, x in enumerate(raw)], dtype=np.float64)
        key = f"v{len(self.tensors)}"
        self.tensors[key] = values.astype(np.float32)
        return {"what": f"a vector at {hook}", "site": site, "strength": self.number(f["strength"][1],
                                                                                     f"{ptr}/strength"),
                "operand": key, "key": key}

    def text(self, value, ptr: str) -> str:
        if not isinstance(value, str) or not value or len(value) > 200:
            raise self.fail(ptr, f"`{ptr}` must be a non-empty string of at most 200 characters")
        return value

    # -- SAEs under --sae-root
    def sae(self, npid: str, ptr: str):
        if npid in self.saes:
            return self.saes[npid]
        if self.sae_root is None:
            raise self.fail(ptr, f"the feature's SAE `{comment(npid, 80)}` is named by its Neuronpedia id, which "
                            "Neuronpedia's server looks up on the hub; steerc reads SAE folders and downloads "
                            "nothing", help="save the SAE as a SAELens folder (SAE.save_model) whose cfg.json has "
                            f"metadata.neuronpedia_id = \"{comment(npid, 80)}\", and give --sae-root DIR",
                            code=FILE_NOT_FOUND)
        found = self.index().get(npid, [])
        if len(found) != 1:
            where = "no SAELens folder" if not found else f"{len(found)} folders ({', '.join(found[:3])})"
            raise self.fail(ptr, f"--sae-root {self.sae_root} holds {where} whose cfg.json names "
                            f"`{comment(npid, 80)}` as its neuronpedia_id", code=FILE_NOT_FOUND,
                            help="save the SAE there as a SAELens folder (SAE.save_model)" if not found else
                            "keep one folder per Neuronpedia SAE under --sae-root")
        from steerc.io.sae import SaeError, read_sae

        try:
            sae = read_sae(found[0])
        except SaeError as exc:
            raise self.fail(ptr, f"the SAE folder {found[0]}: {exc.message}", exc.help, exc.code) from None
        self.saes[npid] = (f"s{len(self.saes)}", sae)
        return self.saes[npid]

    def index(self) -> dict[str, list[str]]:
        """Neuronpedia id -> the folders under ``--sae-root`` whose cfg.json names it (bounded walk)."""
        if self._index is not None:
            return self._index
        self._index, seen = {}, 0
        root = os.path.abspath(self.sae_root)
        if not os.path.isdir(root):
            raise ForeignFileError(FILE_NOT_FOUND, f"--sae-root {self.sae_root} is not a folder")
        for folder, dirs, files in os.walk(root):
            seen += 1
            depth = os.path.relpath(folder, root).count(os.sep) + (folder != root)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < 4 and seen < MAX_FOLDERS else []
            if "cfg.json" in files:
                npid = _neuronpedia_id(os.path.join(folder, "cfg.json"))
                if npid:
                    self._index.setdefault(npid, []).append(folder)
        return self._index

    # -- writing the program
    def write(self, terms: list[dict], multiplier: float, normalize: bool, method: str) -> Imported:
        shown = {k: v for k, v in self.spec.items() if k in _SETTINGS and not isinstance(v, (dict, list))}
        head = [f"# imported from {comment(os.path.basename(self.path), 80)}: a Neuronpedia steering request "
                f"({method}, strength_multiplier {multiplier!r}"
                + (", normalize_steering" if normalize else "") + ")"]
        if shown:
            head.append("# its generation settings: " + comment(", ".join(f"{k} = {v}" for k, v in shown.items())))
        if len(terms) > 1:
            head.append(f"# Neuronpedia's server adds every feature's vector at each of the {len(terms)} features' "
                        "sites (one hook per feature, each adding all of them): so does this program")
        decls = [f"sae {name} = sae({literal(_relative(sae.folder, self.out_dir))})  # neuronpedia {comment(npid)}"
                 for npid, (name, sae) in self.saes.items()]
        if self.tensors:
            decls += [f"vector {k} = load({literal(self.stem + '.safetensors')}, key={literal(k)})"
                      for k in self.tensors]
        total = " + ".join(f"{_number(multiplier * t['strength'])} * "
                           + (f"normalize({t['operand']})" if normalize else t["operand"]) for t in terms)
        blocks = []
        for i, t in enumerate(terms):
            kind, layer = t["site"]
            blocks.append(f"# {comment(t['what'])}, strength {t['strength']!r}\nintervention steer_{i} {{\n"
                          f"  at     {kind}[{layer}]\n  add    {total}\n  tokens all\n}}")
        text = "\n".join(head) + "\nsteer 1\n\n" + "\n".join(decls) + "\n\n" + "\n\n".join(blocks) + "\n"
        files = {}
        if self.tensors:
            from steerc.io.brainpatch import safetensors_bytes

            files[self.stem + ".safetensors"] = safetensors_bytes(
                {k: ("F32", a) for k, a in self.tensors.items()},
                {"steerc.imported_from": f"neuronpedia {os.path.basename(self.path)}"})
        return Imported(text, files)


def _neuronpedia_id(path: str) -> str | None:
    """The neuronpedia_id a SAELens cfg.json names (6.x: under metadata; before 6.0: at the top), or None."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1 << 20)
        cfg = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    npid = meta.get("neuronpedia_id", cfg.get("neuronpedia_id"))
    return npid if isinstance(npid, str) and npid else None


def _relative(folder: str, out_dir: str) -> str:
    return os.path.relpath(os.path.abspath(folder), os.path.abspath(out_dir)).replace(os.sep, "/")


def _number(x: float) -> str:
    return repr(float(x))


__all__ = ["convert", "sniff"]
