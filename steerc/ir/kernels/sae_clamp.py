"""``sae_clamp``: an SAE feature's activation set to ``c``, ``h -> h + (c - f_i(h)) W_dec[i]``.

``f_i(h) = act(pre_i)`` with ``pre_i = (h - b_dec) . W_enc[:, i] + b_enc[i]`` (``b_dec`` is zeros when the
SAE does not subtract it from its input, ``apply_b_dec_to_input`` false) and ``act`` ReLU (``standard``) or
``relu(pre) * [pre > threshold_i]`` (``jumprelu``, strict), as SAELens encodes (``sae_lens/saes``). This is
SAELens's splice with the error term, ``decode(f') + (h - decode(f))`` where ``f'`` is ``f`` with feature
``i`` set to ``c``: every other feature and the error term cancel, leaving ``h + (c - f_i) W_dec[i]``
(spec/language.md, "clamp feature"). Only feature ``i``'s encoder column, bias, threshold and decoder row
are carried, and ``b_dec``: never the whole SAE.
"""

from __future__ import annotations

from steerc.core.record import field, frozen
from steerc.ir.kernels.base import JUMP, REF, Kind, Operand
from steerc.ir.values import Vec

MODES = ("standard", "jumprelu")


@frozen
class SaeClamp:
    enc: Vec  # W_enc[:, i], [d]
    b_enc: float  # b_enc[i]
    threshold: float  # threshold[i] (jumprelu; 0 for standard)
    b_dec: Vec  # b_dec * apply_b_dec_to_input, [d]
    dec: Vec  # W_dec[i], [d]
    target: float  # c
    mode: str  # "standard" | "jumprelu"
    about: str = field(default="", eq=False)  # the SAE and feature, for explain (not carried by formats)


def sae_clamp(S, x, o, mode):
    """``x + (c - f) W_dec[i]`` with ``f = act((x - b_dec) . enc + b_enc)``; numbers may be 0-d tensors (buffers
    that change without re-tracing a compiled graph). The emitted HF package carries this source: plain ASCII."""
    pre = (x - o["b_dec"]) @ o["enc"] + o["b_enc"]
    f = S.torch.relu(pre)
    if mode == "jumprelu":
        f = f * (pre > o["threshold"]).to(f.dtype)
    return x + (o["target"] - f).unsqueeze(-1) * o["dec"]


def batched(S, o, mode):
    """The table row: ``c = x . enc + (b_enc - b_dec . enc)``, ``JUMP`` with ``(threshold, target)`` (a standard
    encoder's threshold is 0: ``relu(pre) * [pre > 0]`` is ``relu(pre)``), ``B = dec``."""
    enc = o["enc"]
    t = S.torch
    p = t.stack([t.as_tensor(o["threshold"] if mode == "jumprelu" else 0.0, dtype=enc.dtype, device=enc.device),
                 t.as_tensor(o["target"], dtype=enc.dtype, device=enc.device)])
    a0 = t.as_tensor(o["b_enc"], dtype=enc.dtype, device=enc.device) - o["b_dec"] @ enc
    return {"A": enc[:, None], "a0": a0.reshape(1), "B": o["dec"][None, :], "code": JUMP, "p": p}


def _operands(op: SaeClamp):
    yield "enc", op.enc.array
    yield "b_enc", float(op.b_enc)
    yield "threshold", float(op.threshold)
    yield "b_dec", op.b_dec.array
    yield "dec", op.dec.array
    yield "target", float(op.target)


def _verify(op: SaeClamp, width: int, where: str, field: str, v) -> None:
    v.check(op.mode in MODES, f"{where}: an SAE clamp's encoder is standard or jumprelu", f"{field}.mode")
    for role in ("enc", "b_dec", "dec"):
        v.check(v.finite_vector(getattr(op, role), width), f"{where}: {role} is not {width} finite numbers",
                f"{field}.{role}")
    for role in ("b_enc", "threshold", "target"):
        v.check(v.f32(getattr(op, role)), f"{where}: {role} is not a finite float32 number", f"{field}.{role}")


def _explain(op: SaeClamp, fmt) -> dict:
    """The formula with ``c``, and the SAE and feature when the op was lowered from a program (``about``)."""
    form = f"h + (c - f_i(h)) W_dec[i], c = {fmt(op.target)}"
    out = {"kind": "sae_clamp", "form": form + (f"; feature {op.about}" if op.about else f", {op.mode} encoder"),
           "encoder": op.mode,
           "target": fmt(op.target)}
    if op.about:
        out["feature"] = op.about
    return out


# ------------------------------------------------------------------- the serve format


def _to_serve(op: SaeClamp, put) -> dict:
    return {"kind": "sae_clamp", "enc": put(op.enc.array), "b_dec": put(op.b_dec.array), "dec": put(op.dec.array),
            "b_enc": float(op.b_enc), "threshold": float(op.threshold), "target": float(op.target), "mode": op.mode}


def _from_serve(d: dict, read) -> SaeClamp:
    return SaeClamp(Vec(read(d["enc"])), float(d["b_enc"]), float(d["threshold"]), Vec(read(d["b_dec"])),
                    Vec(read(d["dec"])), float(d["target"]), d["mode"])


def _check_serve(field: str, d: dict, tensor, width: int, fail) -> None:
    for role in ("enc", "b_dec", "dec"):
        tensor(f"{field}.{role}", d[role], None, width)


SERVE_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["kind", "enc", "b_dec", "dec", "b_enc", "threshold", "target", "mode"],
    "description": "an SAE feature set to target: h + (target - act((h - b_dec) . enc + b_enc)) dec, act ReLU "
                   "(standard) or ReLU times [pre > threshold] (jumprelu)",
    "properties": {"kind": {"const": "sae_clamp"}, "enc": REF, "b_dec": REF, "dec": REF,
                   "b_enc": {"type": "number"}, "threshold": {"type": "number"}, "target": {"type": "number"},
                   "mode": {"enum": list(MODES)}},
}

KIND = Kind(
    name="sae_clamp", op=SaeClamp,
    operands=(Operand("enc", "d"), Operand("b_enc", "1", number=True), Operand("threshold", "1", number=True),
              Operand("b_dec", "d"), Operand("dec", "d"), Operand("target", "1", number=True, bindable=True)),
    operands_of=_operands, maths=sae_clamp, batched=batched, rank=lambda shapes: 1, verify=_verify, explain=_explain,
    to_serve=_to_serve, from_serve=_from_serve, check_serve=_check_serve, serve_schema=SERVE_SCHEMA,
    modes=MODES, mode_of=lambda op: op.mode,
    note="an SAE feature's activation set to c: h -> h + (c - f_i(h)) W_dec[i] (standard or jumprelu encoder)",
)
