"""Reading SAELens SAE folders without sae-lens: the config, the weights a program uses, and the encoders.

A folder as SAELens writes it (``SAE.save_model``) holds ``cfg.json`` and ``sae_weights.safetensors``.
:func:`read_sae` reads and checks the config (SAELens 6.x's keys, and the flat keys of the SAELens before
6.0 as its own ``handle_pre_6_0_config`` renames them) and the safetensors header (every tensor's name,
dtype and shape against the architecture, before any data is touched), and returns an :class:`SAE` that
reads only what is asked of it: :meth:`SAE.decoder_row` reads ``W_dec[i]``, :meth:`SAE.encoder_column`
reads ``W_enc[:, i]`` and the feature's biases and threshold, each by seeking into the file (the header is
read by :func:`steerc.io.vectors.read_safetensors_header`, as for any safetensors file). Nothing is executed.

The encoders are a numpy reference of SAELens's own, float32, in its order of operations
(``sae_lens/saes/*.py`` of sae-lens 6.54):

* ``sae_in = h - b_dec * apply_b_dec_to_input``;
* standard: ``relu(sae_in @ W_enc + b_enc)``;
* jumprelu: ``relu(pre) * (pre > threshold)``, strict, with ``pre = sae_in @ W_enc + b_enc``;
* topk: the ``k`` largest of ``pre`` (times the decoder rows' norms with ``rescale_acts_by_decoder_norm``),
  ReLU'd, every other feature 0: one feature's activation needs the whole encoder;
* gated: ``(sae_in @ W_enc + b_gate > 0) * relu(sae_in @ (W_enc * exp(r_mag)) + b_mag)``.

Everything wrong with a folder is a :class:`SaeError` (a :class:`~steerc.io.vectorfile.VectorFileError`,
so a caller reports it as it reports a vector file's) whose message names the file and the key. SAEs whose
activations are normalized at run time (``normalize_activations`` other than ``none``), ``hook_z`` SAEs and
transcoders are refused, saying so.

>>> import os
>>> folder = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "saes", "smollm2-l8")
>>> sae = read_sae(folder)
>>> sae.architecture, sae.d_in, sae.d_sae, sae.hook_name, sae.site
('jumprelu', 576, 64, 'blocks.8.hook_resid_post', ('resid_post', 8))
>>> sae.decoder_row(3).shape, sae.bytes_read
((576,), 2304)
>>> site_of_hook("blocks.12.hook_resid_pre"), site_of_hook("blocks.3.attn.hook_z")
(('resid_pre', 12), None)
"""

from __future__ import annotations

import math
import numbers
import os
import re
import stat

from steerc.core.jsonio import JSONError
from steerc.core.jsonio import read_file as read_json_file
from steerc.core.limits import MAX_HIDDEN, MAX_JSON_BYTES, MAX_SAE_DENSE_VALUES, MAX_SAE_FEATURES, human
from steerc.core.record import frozen
from steerc.diagnostics.codes import (
    FILE_NOT_FOUND,
    INVALID_VALUE,
    INVALID_VECTOR_FILE,
    LIMIT_EXCEEDED,
    PATH_ESCAPE,
)
from steerc.io.vectorfile import TensorInfo, VectorFileError
from steerc.io.vectors import SAFETENSORS_FLOATS, read_safetensors_header

CONFIG = "cfg.json"  # sae_lens.constants.SAE_CFG_FILENAME
WEIGHTS = "sae_weights.safetensors"  # sae_lens.constants.SAE_WEIGHTS_FILENAME

ARCHITECTURES = ("standard", "jumprelu", "topk", "gated")  # what steerc reads
TRANSCODERS = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")
OTHER_SAELENS = ("abstopk", "batchtopk", "matryoshka_batchtopk", "temporal", "matching_pursuit")
DTYPES = ("float32", "float64", "float16", "bfloat16")  # sae_lens.constants.DTYPE_MAP, less the "torch." spellings
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm", "covariance_whitening")

# The tensors of each architecture, as SAELens's state_dict names them: (name, shape) with "in" for d_in and
# "sae" for d_sae. SAELens loads with load_state_dict(strict=True), so a missing or an extra tensor fails there.
_COMMON = (("W_enc", ("in", "sae")), ("W_dec", ("sae", "in")), ("b_dec", ("in",)))
TENSORS = {
    "standard": _COMMON + (("b_enc", ("sae",)),),
    "jumprelu": _COMMON + (("b_enc", ("sae",)), ("threshold", ("sae",))),
    "topk": _COMMON + (("b_enc", ("sae",)),),
    "gated": _COMMON + (("b_gate", ("sae",)), ("b_mag", ("sae",)), ("r_mag", ("sae",))),
}
# SAELens's loader drops a `scaling_factor` of all ones (read_sae_components_from_disk); any other value is a
# fine-tuning scale its 6.x SAEs no longer take.
SCALING_FACTOR = "scaling_factor"

# The hook names TransformerLens gives the residual stream and the blocks' outputs, and steerc's sites.
HOOK_SITES = {
    "hook_resid_pre": "resid_pre",
    "hook_resid_post": "resid_post",
    "hook_attn_out": "attn_out",
    "hook_mlp_out": "mlp_out",
}
_HOOK = re.compile(r"blocks\.([0-9]{1,6})\.(.+)", re.ASCII)
_UNMAPPED = {  # TransformerLens hooks inside a block that are no steerc site, and what they are
    "hook_resid_mid": "the residual stream between the attention and the MLP block",
    "hook_mlp_in": "the MLP block's input",
    "mlp.hook_pre": "the MLP's hidden activations before its nonlinearity",
    "mlp.hook_post": "the MLP's hidden activations",
    "attn.hook_z": "the attention heads' outputs before the output projection, head by head (a hook_z SAE)",
    "attn.hook_result": "each head's output after the output projection",
    "ln1.hook_normalized": "the attention block's normalized input",
    "ln2.hook_normalized": "the MLP block's normalized input",
}


class SaeError(VectorFileError):
    """An SAE folder steerc cannot read, or a request it cannot serve; ``file`` and ``key`` say where."""

    def __init__(self, code: str, message: str, help: str | None = None, file: str | None = None,
                 key: str | None = None):
        super().__init__(code, message, help)
        self.file = file
        self.key = key


# ------------------------------------------------------------------------- hooks


def site_of_hook(hook_name: str) -> tuple[str, int] | None:
    """steerc's ``(site, layer)`` for a TransformerLens hook name, or None where it has none
    (:func:`why_no_site` says why).

    >>> site_of_hook("blocks.8.hook_resid_post"), site_of_hook("blocks.0.hook_mlp_out")
    (('resid_post', 8), ('mlp_out', 0))
    >>> site_of_hook("blocks.8.hook_mlp_in") is None
    True
    """
    m = _HOOK.fullmatch(hook_name) if isinstance(hook_name, str) else None
    if m is None or m.group(2) not in HOOK_SITES:
        return None
    return HOOK_SITES[m.group(2)], int(m.group(1))


def why_no_site(hook_name) -> str | None:
    """Why :func:`site_of_hook` gives ``hook_name`` no site (None when it gives one).

    >>> print(why_no_site("blocks.8.hook_mlp_in"))
    `blocks.8.hook_mlp_in` is the MLP block's input, which is no steerc site (steerc steers resid_pre, resid_post, attn_out and mlp_out)
    """
    if site_of_hook(hook_name) is not None:
        return None
    sites = "steerc steers resid_pre, resid_post, attn_out and mlp_out"
    if not isinstance(hook_name, str) or not hook_name:
        return f"the SAE names no hook, so the site it reads is unknown ({sites})"
    m = _HOOK.fullmatch(hook_name)
    what = _UNMAPPED.get(m.group(2)) if m else None
    if what is None and hook_name.endswith("hook_z"):
        what = _UNMAPPED["attn.hook_z"]
    if what is not None:
        return f"`{hook_name}` is {what}, which is no steerc site ({sites})"
    return (f"`{hook_name}` is not a hook steerc knows (TransformerLens's `blocks.L.hook_resid_pre`, "
            f"`hook_resid_post`, `hook_attn_out` or `hook_mlp_out`; {sites})")


# ------------------------------------------------------------------------ config


@frozen
class SaeConfig:
    """What ``cfg.json`` says, in SAELens 6.x's terms whatever version wrote it."""

    architecture: str
    d_in: int
    d_sae: int
    dtype: str  # what SAELens computes in; steerc's reference computes in float32 (see spec/formats.md)
    apply_b_dec_to_input: bool
    normalize_activations: str
    hook_name: str | None
    model_name: str | None
    neuronpedia_id: str | None
    sae_lens_version: str | None
    pre_6: bool  # written by a SAELens before 6.0 (flat keys, read as its handle_pre_6_0_config reads them)
    k: int | None = None  # topk only
    rescale_acts_by_decoder_norm: bool = False  # topk only


def _error(message: str, file: str, key: str | None = None, help: str | None = None,
           code: str = INVALID_VECTOR_FILE) -> SaeError:
    return SaeError(code, message, help, file=file, key=key)


def _version_6(version) -> bool | None:
    """Whether a ``sae_lens_version`` is 6.0.0-rc.0 or later (SAELens's own test); None when unreadable."""
    m = re.fullmatch(r"v?([0-9]{1,9})\.([0-9]{1,9})(?:\.([0-9]{1,9}))?(.*)", version.strip(), re.ASCII)
    if m is None:
        return None
    major, minor, patch, rest = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), m.group(4).lower()
    if major != 6 or minor or patch:
        return major >= 6
    # 6.0.0 itself: a release or a release candidate is 6.x; an alpha, beta or dev release came before rc.0
    return not re.match(r"[-_.]?(a|alpha|b|beta|dev)", rest)


def _parse_config(cfg: dict, file: str) -> SaeConfig:
    """``cfg.json`` as SAELens 6.54 reads it (handle_config_defaulting, then SAEConfig.from_dict)."""
    meta = cfg.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise _error("`metadata` must be an object", file, "metadata")
    version, key = cfg.get("sae_lens_version"), "sae_lens_version"
    if not version and meta:
        version, key = meta.get("sae_lens_version"), "metadata.sae_lens_version"
    if version and not isinstance(version, str):
        raise _error(f"`{key}` must be a version string, not {_shown(version)}", file, key)
    is_6 = _version_6(version) if version else False
    if is_6 is None:
        raise _error(f"`{key}` {_shown(version)} is not a version SAELens reads", file, key)
    return _config_6(cfg, meta or {}, file, version) if is_6 else _config_pre_6(cfg, file, version)


def _config_6(cfg: dict, meta: dict, file: str, version: str | None) -> SaeConfig:
    if "architecture" not in cfg:
        raise _error("`architecture` is missing (SAELens 6 writes it: standard, jumprelu, topk, gated, ...)",
                     file, "architecture")
    for key in ("hook_name_out", "hf_hook_name_out"):
        if meta.get(key) is not None:
            raise _transcoder(file, f"metadata.{key}")
    return _config(cfg, meta, file, version, pre_6=False, metadata_prefix="metadata.")


_RENAMED = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
            "activation_fn_str": "activation_fn"}  # handle_pre_6_0_config's rename_keys_map
_META_KEYS = ("model_name", "hook_name", "hook_head_index", "neuronpedia_id", "sae_lens_version",
              "hook_name_out")  # of its LLM_METADATA_KEYS, those steerc reads


def _config_pre_6(cfg: dict, file: str, version: str | None) -> SaeConfig:
    """The flat keys of SAELens before 6.0, renamed and defaulted as ``handle_pre_6_0_config`` does."""
    new = {}
    for key, value in cfg.items():
        new[_RENAMED.get(key, key)] = value
    if new.get("hook_name_out") is not None:
        raise _transcoder(file, "hook_name_out")
    fn = new.get("activation_fn", "relu")
    arch = new.get("architecture", "standard")
    kwargs = new.get("activation_fn_kwargs")
    if fn == "topk":
        if not isinstance(kwargs, dict) or kwargs.get("k") is None:
            raise _error("a topk SAE needs its `activation_fn_kwargs.k` (without it SAELens 6 would encode it "
                         "with a ReLU)", file, "activation_fn_kwargs")
        arch, new["k"] = "topk", kwargs["k"]
    elif fn not in ("relu", "topk"):  # SAELens 6 ignores it (its standard SAE is ReLU): say what was written
        key = next(k for k in ("activation_fn_str", "activation_fn") if k in cfg)
        raise _error(f"`{key}` is {_shown(fn)}: steerc reads ReLU SAEs (and topk, jumprelu and gated ones), and "
                     "SAELens 6 would silently encode this one with a ReLU", file, key)
    new["architecture"] = arch
    norm = new.get("normalize_activations")
    if isinstance(norm, bool):
        new["normalize_activations"] = "expected_average_only_in" if norm else "none"
    elif norm is None:
        new["normalize_activations"] = "none"
    new.setdefault("apply_b_dec_to_input", True)
    hook = new.get("hook_name")
    new.setdefault("reshape_activations", "hook_z" if isinstance(hook, str) and "hook_z" in hook else "none")
    meta = {k: new[k] for k in _META_KEYS if k in new}
    return _config(new, meta, file, version, pre_6=True, metadata_prefix="", names=_pre_6_names(cfg))


def _pre_6_names(cfg: dict) -> dict[str, str]:
    """The key a pre-6.0 file used for each 6.x name (``hook_point`` for ``hook_name``), for messages."""
    return {_RENAMED[k]: k for k in _RENAMED if k in cfg}


def _transcoder(file: str, key: str) -> SaeError:
    return _error("this is a transcoder (it reads one hook and writes another); steerc reads SAEs, which "
                  "reconstruct the activation they read", file, key,
                  help="use an SAE trained on one hook (architecture standard, jumprelu, topk or gated)")


def _config(cfg: dict, meta: dict, file: str, version, *, pre_6: bool, metadata_prefix: str,
            names: dict[str, str] | None = None) -> SaeConfig:
    """The checked config; ``metadata_prefix`` and ``names`` say how the file spelt each key, for messages."""
    names = names or {}

    def key_of(key: str, in_meta: bool = False) -> str:
        return (metadata_prefix if in_meta else "") + names.get(key, key)

    arch = _architecture(cfg, file)
    d_in = _count(cfg, "d_in", file, MAX_HIDDEN, "entries in the activation an SAE reads", LIMIT_EXCEEDED)
    d_sae = _count(cfg, "d_sae", file, MAX_SAE_FEATURES, "features", LIMIT_EXCEEDED)
    dtype = cfg.get("dtype", "float32")
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in DTYPES:
        raise _error(f"`dtype` is {_shown(dtype)}; SAELens takes {', '.join(DTYPES)}", file, "dtype")
    apply = _flag(cfg, "apply_b_dec_to_input", True, file)
    norm = _normalization(cfg, file)
    hook = _hook(cfg, meta, file, key_of)
    model_name, neuronpedia_id = (_meta_string(meta, name, file, key_of) for name in ("model_name", "neuronpedia_id"))
    k, rescale = None, False
    if arch == "topk":
        k = _count(cfg, "k", file, d_sae, "features kept (d_sae)", default=100)  # TopKSAEConfig.k's default
        rescale = _flag(cfg, "rescale_acts_by_decoder_norm", False, file)
    return SaeConfig(arch, d_in, d_sae, dtype.removeprefix("torch."), apply, norm, hook, model_name,
                     neuronpedia_id, version, pre_6, k, rescale)


def _architecture(cfg: dict, file: str) -> str:
    """One of :data:`ARCHITECTURES`; a transcoder or another architecture is refused, saying which."""
    arch = cfg["architecture"]
    if not isinstance(arch, str):
        raise _error(f"`architecture` must be a string, not {_shown(arch)}", file, "architecture")
    if arch in TRANSCODERS:
        raise _transcoder(file, "architecture")
    if arch not in ARCHITECTURES:
        known = " (a SAELens architecture steerc does not read yet)" if arch in OTHER_SAELENS else ""
        raise _error(f"`architecture` is {_shown(arch)}{known}; steerc reads standard, jumprelu, topk and gated "
                     "SAEs", file, "architecture")
    return arch


def _flag(cfg: dict, key: str, default: bool, file: str) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise _error(f"`{key}` must be true or false, not {_shown(value)}", file, key)
    return value


def _normalization(cfg: dict, file: str) -> str:
    """``"none"``: an SAE that normalizes its input at run time encodes something other than ``h``."""
    norm = cfg.get("normalize_activations", "none")
    if norm == "none":
        return norm
    known = norm in NORMALIZATIONS
    raise _error(
        f"`normalize_activations` is {_shown(norm)}: "
        + ("this SAE normalizes each activation before encoding it (and back after decoding), which steerc "
           "does not do; " if known else "not a normalization SAELens knows; ")
        + "steerc reads SAEs whose `normalize_activations` is \"none\"", file, "normalize_activations",
        help="fold the normalization into the weights first (SAELens's fold_activation_norm_scaling_factor "
             "or fold_activation_whitening), then save the SAE again" if known else None)


def _hook(cfg: dict, meta: dict, file: str, key_of) -> str | None:
    """The hook name; hook_z SAEs and SAEs of one head are refused (steerc has no such site)."""
    hook = meta.get("hook_name")
    if hook is not None and not isinstance(hook, str):
        raise _error(f"`{key_of('hook_name', True)}` must be a string, not {_shown(hook)}", file,
                     key_of("hook_name", True))
    reshape = cfg.get("reshape_activations", "none")
    if reshape == "hook_z" or (isinstance(hook, str) and hook.endswith("hook_z")):
        key = "reshape_activations" if reshape == "hook_z" else key_of("hook_name", True)
        raise _error("this is a hook_z SAE (it reads the attention heads' outputs head by head, before the output "
                     "projection); steerc has no such site", file, key,
                     help="use an SAE trained at resid_pre, resid_post, attn_out or mlp_out")
    if reshape != "none":
        raise _error(f"`reshape_activations` is {_shown(reshape)}; SAELens takes \"none\" or \"hook_z\"", file,
                     "reshape_activations")
    head = meta.get("hook_head_index")
    if head is not None:
        raise _error(f"`{key_of('hook_head_index', True)}` is {_shown(head)}: this SAE reads one attention head "
                     "of its hook, which is no steerc site", file, key_of("hook_head_index", True))
    return hook


def _meta_string(meta: dict, name: str, file: str, key_of) -> str | None:
    value = meta.get(name)
    if value is not None and not isinstance(value, str):
        raise _error(f"`{key_of(name, True)}` must be a string, not {_shown(value)}", file, key_of(name, True))
    return value


def _count(cfg: dict, key: str, file: str, most: int, what: str, code: str = INVALID_VECTOR_FILE,
           default: int | None = None) -> int:
    """A positive whole number of ``cfg`` (``key`` absent: ``default``, or an error), at most ``most``
    (``code`` past it)."""
    if key not in cfg and default is not None:
        value = default
    else:
        value = cfg.get(key)
    if type(value) is not int or value < 1:
        missing = key not in cfg
        raise _error(f"`{key}` is missing" if missing else f"`{key}` must be a whole number above 0, not "
                     f"{_shown(value)}", file, key)
    if value > most:
        raise _error(f"`{key}` is {value:,}; steerc reads at most {most:,} {what}", file, key, code=code)
    return value


def _shown(value) -> str:
    """A config value as a message quotes it: JSON-like, cut at 60 characters."""
    import json

    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ----------------------------------------------------------------------- weights


@frozen
class EncoderColumn:
    """What feature ``index``'s activation reads: its encoder column ``W_enc[:, index]`` and its scalars.

    ``bias`` is ``b_enc[index]`` (``b_gate[index]`` for a gated SAE); ``threshold`` is a jumprelu SAE's,
    ``b_mag`` and ``r_mag`` a gated SAE's magnitude path's.
    """

    index: int
    w: object  # numpy float32 [d_in], read-only
    bias: object  # numpy float32 scalar
    threshold: object = None
    b_mag: object = None
    r_mag: object = None


class SAE:
    """An SAE folder, read on demand: see the module's doc. ``bytes_read`` counts the tensor bytes read."""

    def __init__(self, folder: str, config: SaeConfig, weights_path: str, tensors: dict[str, TensorInfo],
                 entries: dict[str, tuple[str, int]]):
        self.folder = folder
        self.config = config
        self.weights_path = weights_path
        self.tensors = tensors  # name -> TensorInfo (safetensors dtype, shape)
        self._entries = entries  # name -> (byte format, absolute offset of its data)
        self._whole: dict[str, object] = {}
        self._rows: dict[int, object] = {}
        self._columns: dict[int, EncoderColumn] = {}
        self._scalars: dict[tuple[str, int], object] = {}
        self.bytes_read = 0

    def __repr__(self) -> str:
        return (f"SAE({self.folder!r}: {self.architecture}, d_in={self.d_in}, d_sae={self.d_sae}, "
                f"hook={self.hook_name!r})")

    architecture = property(lambda self: self.config.architecture)
    d_in = property(lambda self: self.config.d_in)
    d_sae = property(lambda self: self.config.d_sae)
    hook_name = property(lambda self: self.config.hook_name)
    neuronpedia_id = property(lambda self: self.config.neuronpedia_id)
    model_name = property(lambda self: self.config.model_name)

    @property
    def site(self) -> tuple[str, int] | None:
        """steerc's ``(site, layer)`` of the SAE's hook, or None (:attr:`site_reason` says why)."""
        return site_of_hook(self.hook_name) if self.hook_name is not None else None

    @property
    def site_reason(self) -> str | None:
        return why_no_site(self.hook_name)

    @property
    def feature_is_local(self) -> bool:
        """Whether one feature's activation reads only its own encoder column (not for topk: the k largest
        of all the features' pre-activations are kept, so each needs the whole encoder)."""
        return self.architecture != "topk"

    # ---- reading

    def _check_index(self, index) -> int:
        """``index`` as an int, when it is a whole number (a numpy integer too; not a bool) of a feature."""
        whole = isinstance(index, numbers.Integral) and not isinstance(index, bool)
        if not whole or not 0 <= int(index) < self.d_sae:
            raise SaeError(INVALID_VALUE, f"feature {_shown(index)} is out of range: the SAE has {self.d_sae:,} "
                           f"features (0 .. {self.d_sae - 1:,})", file=self.weights_path)
        return int(index)

    def _read(self, name: str, spans: list[tuple[int, int]], shown: str):
        """The float32 values of ``name`` at ``spans`` (element offset, count), one read each, finite."""
        import numpy as np

        fmt, start = self._entries[name]
        size = 2 if fmt == "bf16" else int(fmt[2])
        chunks = []
        with open(self.weights_path, "rb", buffering=0) as fh:
            fd = fh.fileno()
            for offset, count in spans:
                want = count * size
                data = _pread(fd, want, start + offset * size)
                self.bytes_read += len(data)
                if len(data) != want:  # cut short since its header was read
                    raise _error(f"the data of `{shown}` runs past the end of the file", WEIGHTS, shown)
                chunks.append(data)
        raw = b"".join(chunks)
        if fmt == "bf16":
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=fmt)
        with np.errstate(over="ignore", invalid="ignore"):  # past float32 is inf, refused just below
            values = values.astype(np.float32)
        if not np.all(np.isfinite(values)):
            raise _error(f"`{shown}` holds NaN or infinite values", WEIGHTS, shown)
        values.setflags(write=False)
        return values

    def _scalar(self, name: str, index: int):
        key = (name, index)
        if key not in self._scalars:
            self._scalars[key] = self._read(name, [(index, 1)], f"{name}[{index}]")[0]
        return self._scalars[key]

    def tensor(self, name: str):
        """The whole tensor ``name`` as a read-only float32 array (once; at most MAX_SAE_DENSE_VALUES entries)."""
        if name not in self.tensors:
            raise _error(f"the SAE has no tensor `{name}` (it has {', '.join(sorted(self.tensors))})", WEIGHTS, name)
        if name not in self._whole:
            shape = self.tensors[name].shape
            count = math.prod(shape)
            if count > MAX_SAE_DENSE_VALUES:
                raise _error(f"`{name}` has {count:,} entries; steerc reads at most "
                             f"{human(MAX_SAE_DENSE_VALUES)} of one SAE tensor whole", WEIGHTS, name,
                             code=LIMIT_EXCEEDED)
            self._whole[name] = self._read(name, [(0, count)], name).reshape(shape)
        return self._whole[name]

    def decoder_row(self, index: int):
        """``W_dec[index]``, the feature's direction in the activation space (float32 [d_in]); reads that row."""
        index = self._check_index(index)
        if index not in self._rows:
            if "W_dec" in self._whole:
                self._rows[index] = self._whole["W_dec"][index]
            else:
                self._rows[index] = self._read("W_dec", [(index * self.d_in, self.d_in)], f"W_dec[{index}]")
        return self._rows[index]

    def encoder_column(self, index: int) -> EncoderColumn:
        """Feature ``index``'s encoder column and scalars (see :class:`EncoderColumn`); reads only those."""
        index = self._check_index(index)
        if index not in self._columns:
            d_sae = self.d_sae
            if "W_enc" in self._whole:
                w = self._whole["W_enc"][:, index]
            else:
                w = self._read("W_enc", [(j * d_sae + index, 1) for j in range(self.d_in)], f"W_enc[:, {index}]")
            if self.architecture == "gated":
                column = EncoderColumn(index, w, self._scalar("b_gate", index), b_mag=self._scalar("b_mag", index),
                                       r_mag=self._scalar("r_mag", index))
            else:
                threshold = self._scalar("threshold", index) if self.architecture == "jumprelu" else None
                column = EncoderColumn(index, w, self._scalar("b_enc", index), threshold=threshold)
            self._columns[index] = column
        return self._columns[index]

    # ---- encoding (numpy float32, SAELens's order of operations)

    def sae_in(self, h):
        """SAELens's ``process_sae_in``: ``h - b_dec * apply_b_dec_to_input``, float32 (``h``: [..., d_in])."""
        import numpy as np

        h = np.asarray(h, dtype=np.float32)
        if h.ndim < 1 or h.shape[-1] != self.d_in:
            raise SaeError(INVALID_VALUE, f"the activations have shape {list(h.shape)}; this SAE reads "
                           f"[..., {self.d_in}]", file=self.weights_path)
        return h - self.tensor("b_dec") * np.float32(self.config.apply_b_dec_to_input)

    def activate(self, pre, gate_pre=None, threshold=None):
        """The activation function on pre-activations (any shape whose last axis is the features'):
        ReLU; jumprelu ``relu(pre) * (pre > threshold)``; gated ``(gate_pre > 0) * relu(pre)``, ``pre`` the
        magnitude path's. ``threshold`` defaults to the SAE's whole ``threshold`` (a feature's own for one
        feature). Not for topk (see :meth:`encode`)."""
        import numpy as np

        base = np.maximum(pre, np.float32(0))
        if self.architecture == "jumprelu":
            threshold = self.tensor("threshold") if threshold is None else threshold
            return base * (pre > threshold).astype(np.float32)
        if self.architecture == "gated":
            return (gate_pre > 0).astype(np.float32) * base
        return base

    def encode(self, h):
        """Every feature's activation, float32 [..., d_sae]: SAELens's ``SAE.encode``. Reads the whole encoder."""
        import numpy as np

        x = self.sae_in(h)
        w = self.tensor("W_enc")
        if self.architecture == "gated":
            gate = x @ w + self.tensor("b_gate")
            mag = x @ (w * np.exp(self.tensor("r_mag"))) + self.tensor("b_mag")
            return self.activate(mag, gate_pre=gate)
        pre = x @ w + self.tensor("b_enc")
        if self.architecture == "topk":
            return self._topk(pre)
        return self.activate(pre)

    def _topk(self, pre):
        """TopKSAE.encode's activation: the k largest of ``pre`` (rescaled by the decoder rows' norms), ReLU'd,
        scattered into zeros. Which of equal values at the k-th place is kept is torch.topk's choice there and
        numpy's here."""
        import numpy as np

        if self.config.rescale_acts_by_decoder_norm:
            pre = pre * np.linalg.norm(self.tensor("W_dec"), axis=-1)
        k = self.config.k
        top = np.argpartition(pre, -k, axis=-1)[..., -k:]
        out = np.zeros_like(pre)
        np.put_along_axis(out, top, np.maximum(np.take_along_axis(pre, top, axis=-1), np.float32(0)), axis=-1)
        return out

    def feature_activation(self, h, index: int):
        """Feature ``index``'s activation on ``h`` ([..., d_in] -> [...]), float32: ``encode(h)[..., index]``,
        reading only the feature's encoder column and scalars (:meth:`encoder_column`), and ``b_dec``. A topk
        SAE's feature needs the whole encoder (it is kept only among the k largest): it is read whole."""
        import numpy as np

        index = self._check_index(index)
        if not self.feature_is_local:
            return self.encode(h)[..., index]
        x = self.sae_in(h)
        col = self.encoder_column(index)
        if self.architecture == "gated":
            gate = x @ col.w + col.bias
            mag = x @ (col.w * np.exp(col.r_mag)) + col.b_mag
            return self.activate(mag, gate_pre=gate)
        return self.activate(x @ col.w + col.bias, threshold=col.threshold)


def _pread(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes at ``offset`` of an open file (fewer at its end), read at once, without moving its position."""
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # pragma: no cover - Windows
    return os.read(fd, n)


# --------------------------------------------------------------------- the folder


def read_sae(folder: str, root: str | None = None) -> SAE:
    """The SAE in ``folder`` (``cfg.json`` and ``sae_weights.safetensors``), its config and header checked.

    With ``root``, the folder and both files must resolve (symbolic links followed) inside ``root``, as
    every file a program names must (``path-escape`` otherwise, before anything is read). Raises
    :class:`SaeError`; reads no tensor data.
    """
    real = os.path.realpath(folder)
    if root is not None:
        _inside(real, root, folder)
    if not os.path.isdir(real):
        what = "is a file, not an SAE folder" if os.path.exists(real) else "does not exist"
        raise SaeError(FILE_NOT_FOUND if not os.path.exists(real) else INVALID_VECTOR_FILE,
                       f"`{folder}` {what}", help=f"an SAE folder holds {CONFIG} and {WEIGHTS}, as SAELens "
                       "saves it (SAE.save_model)")
    cfg_path, weights_path = (_member(real, name, folder, root) for name in (CONFIG, WEIGHTS))
    try:
        _, cfg = read_json_file(cfg_path, max_bytes=MAX_JSON_BYTES)
    except JSONError as exc:
        raise _error(f"`{CONFIG}` is not JSON steerc reads ({exc})", CONFIG) from None
    except OSError as exc:
        raise _error(f"cannot read `{CONFIG}` ({exc.strerror})", CONFIG) from None
    if not isinstance(cfg, dict):
        raise _error(f"`{CONFIG}` must hold a JSON object", CONFIG)
    config = _parse_config(cfg, CONFIG)
    tensors, entries = _read_header(weights_path, config)
    return SAE(real, config, weights_path, tensors, entries)


def _inside(real: str, root: str, shown: str) -> None:
    root_real = os.path.realpath(root)
    if not (real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)):
        raise SaeError(PATH_ESCAPE, f"`{shown}` leaves the project root", help=f"the project root is {root_real}")


def _member(real: str, name: str, shown: str, root: str | None) -> str:
    """The real path of the folder's file ``name``: a regular file (a link to one inside ``root``)."""
    path = os.path.join(real, name)
    if not os.path.lexists(path):
        raise _error(f"`{shown}` has no `{name}`: an SAE folder holds {CONFIG} and {WEIGHTS}, as SAELens saves it",
                     name, help="save the SAE with sae-lens (SAE.save_model(folder))")
    target = os.path.realpath(path)
    if root is not None:
        _inside(target, root, os.path.join(shown, name))
    try:
        mode = os.stat(target).st_mode
    except OSError as exc:
        raise _error(f"cannot read `{name}` ({exc.strerror})", name) from None
    if not stat.S_ISREG(mode):
        raise _error(f"`{name}` is not a regular file", name)
    return target


def _read_header(path: str, config: SaeConfig) -> tuple[dict[str, TensorInfo], dict[str, tuple[str, int]]]:
    """The tensors of ``sae_weights.safetensors``, checked against the architecture before any data is read."""
    try:
        header, data_start = read_safetensors_header(path)
    except VectorFileError as exc:
        raise _error(f"`{WEIGHTS}`: {exc.message}", WEIGHTS) from None
    except OSError as exc:
        raise _error(f"cannot read `{WEIGHTS}` ({exc.strerror})", WEIGHTS) from None
    dims = {"in": config.d_in, "sae": config.d_sae}
    want = {name: tuple(dims[d] for d in shape) for name, shape in TENSORS[config.architecture]}
    found = {name: e for name, e in header.items() if name != "__metadata__"}
    missing = [name for name in want if name not in found]
    if missing:
        raise _error(f"`{WEIGHTS}` has no tensor `{missing[0]}`, which a {config.architecture} SAE needs (it has "
                     f"{', '.join(sorted(found)) or 'none'})", WEIGHTS, missing[0])
    extra = sorted(name for name in found if name not in want and name != SCALING_FACTOR)
    if extra:
        raise _error(f"`{WEIGHTS}` holds `{extra[0]}`, which a {config.architecture} SAE does not have (SAELens "
                     f"refuses it too: it holds {', '.join(want)})", WEIGHTS, extra[0])
    tensors, entries = {}, {}
    for name, entry in found.items():
        shape = tuple(entry["shape"])
        expected = want.get(name, (config.d_sae,))
        if shape != expected:
            raise _error(f"`{name}` has shape {list(shape)}; with d_in = {config.d_in:,} and d_sae = "
                         f"{config.d_sae:,} ({CONFIG}) it must be {list(expected)}", WEIGHTS, name)
        if entry["dtype"] not in SAFETENSORS_FLOATS:
            raise _error(f"`{name}` has dtype {entry['dtype']}; SAE weights must be floating point", WEIGHTS, name)
        tensors[name] = TensorInfo(name, entry["dtype"], shape)
        entries[name] = (SAFETENSORS_FLOATS[entry["dtype"]], data_start + entry["data_offsets"][0])
    sae_tensors = (tensors, entries)
    if SCALING_FACTOR in found:
        _scaling_is_one(path, config, *sae_tensors)
    return sae_tensors


def _scaling_is_one(path: str, config: SaeConfig, tensors, entries) -> None:
    """SAELens drops a ``scaling_factor`` of all ones; any other is a scale its 6.x SAEs do not apply."""
    import numpy as np

    probe = SAE(os.path.dirname(path), config, path, tensors, entries)
    if not np.all(probe.tensor(SCALING_FACTOR) == 1):
        raise _error(f"`{SCALING_FACTOR}` is not all ones: a fine-tuning scale SAELens 6 does not load either",
                     WEIGHTS, SCALING_FACTOR, help="fold it into the decoder, or save the SAE again with sae-lens 6")
    del tensors[SCALING_FACTOR], entries[SCALING_FACTOR]
