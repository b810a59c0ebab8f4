"""Reading activations inside a vLLM worker (torch only): the worker half of :func:`steerc.runtime.vllm.capture`.

A capture is begun by the ``steerc_capture_begin`` RPC with a spec (spec/derive.md, *Capture*)::

    {"sites": [{"key": "resid_post.8", "module": "model.layers.8", "kind": "post", "tensor": "fused_pair",
                "columns": null, "head": null}, ...],
     "rows": [[a, b], ...]}

and every request that carries ``SamplingParams.extra_args["steerc_capture"] = i`` is read at its
positions ``[a, b)`` of ``rows[i]``: each site's tensor, summed in float64 over those positions, whatever
the batching or chunked prefill split (the metadata of each step says which token is which request's at
which position). ``steerc_capture_end`` returns the means and removes the hooks.

* The hooks only read: they are registered after the plan's own hooks, so a capture reads the stream as
  steered by every intervention that precedes the site (the plan's hooks at the same module included).
* A fused (hidden, residual) pair is read as its sum, the stream; the last layer's is read before the
  final norm.
* Under tensor parallelism a residual site is whole on every rank and is returned by rank 0; a head
  site is returned by the rank that holds the head, at its local columns.
* **Taps**, for compiled engines: sites named when the engine starts (``load(..., capture=...)``,
  ``additional_config["steerc"]["capture"]``) get a :class:`Taps` hook before torch.compile traces the
  model. Each copies its site's tensor (the head's columns, a fused pair's sum, in the compute dtype)
  into a fixed ``[max_num_batched_tokens, width]`` buffer, a traced in-place copy like the plan's own
  state, and counts its runs inside the graph. After each forward the capture reads the step's rows
  out of the buffers, with the same positions it would have hooked; a tap that did not run in a step
  the capture read is an error, never zeros. An eager engine reads a tapped site through its tap too,
  and any other site through a hook of its own; a compiled engine refuses a site it has no tap for.
* A site ``{"key": "probe.<name>", "kind": "probe", "name": <name>}`` reads one of the installed plan's
  probes, as its gates read it, after each forward: a per-token probe's value at each position, a
  pooled one's held value of the position's request (``derive --calibrate --engine vllm``).
* ``"per_position": true`` keeps every position instead of the mean: a site's answer is then
  ``[sum of (b - a), width]``, the rows' positions one after the other. The site ``{"key": "logprobs",
  "kind": "logprobs"}`` reads the model's final hidden states (after the final norm) and answers the
  log-distributions over the vocabulary they predict, computed in the worker (``compute_logits``, then
  ``log_softmax`` in float32, as vLLM's own logprobs are): ``steerc eval --engine vllm``'s KL.
"""

from __future__ import annotations

import numpy as np
import torch

CAPTURE_KEY = "steerc_capture"
MAX_ROWS = 1_000_000
MAX_POSITIONS = 65_536


MAX_TAPS = 4096


class CaptureError(ValueError):
    """A capture spec or request the worker refuses (the message names the field)."""


def answering(site: dict, *, tp_rank: int, tp_size: int, heads: int, head_dim: int):
    """(whether this rank answers for ``site``, the columns it reads): rank 0 for a whole site, the owning
    rank for a head (at its local columns)."""
    if site.get("head") is None:
        return tp_rank == 0, site.get("columns")
    h = int(site["head"])
    local_heads = heads // tp_size
    j = h % local_heads
    return h // local_heads == tp_rank, [j * head_dim, (j + 1) * head_dim]


def site_value(site: dict, args, kwargs, output):
    """The tensor a site reads, from its module's call: a pre hook's input, a fused (hidden, residual)
    pair's sum (in float64), or the output."""
    if site["kind"] == "pre":
        index = 1 if site["tensor"] == "input1" else 0
        return args[index] if len(args) > index else kwargs["hidden_states"]
    if site["tensor"] == "fused_pair":
        hidden, residual = output[0], output[1]
        return hidden if residual is None else hidden.to(torch.float64) + residual.to(torch.float64)
    return output[0] if isinstance(output, tuple) else output


def _on(module, site: dict, read):
    """``read(tensor)`` on each call of ``module``, per the site's kind (runs after the plan's hooks)."""
    if site["kind"] == "pre":
        return module.register_forward_pre_hook(lambda mod, args, kwargs: read(site_value(site, args, kwargs, None)),
                                                with_kwargs=True)
    return module.register_forward_hook(lambda mod, args, output: read(site_value(site, args, None, output)))


class Taps(torch.nn.Module):
    """The capture taps of a compiled engine: fixed buffers its graph copies the sites' tensors into."""

    def __init__(self, model, sites, *, tp_rank: int, tp_size: int, heads: int, head_dim: int, max_tokens: int,
                 dtype, device):
        super().__init__()
        if not isinstance(sites, list) or len(sites) > MAX_TAPS:
            raise CaptureError(f"capture: a list of at most {MAX_TAPS} sites")
        self.max_tokens = max_tokens
        self.index: dict[str, int] = {}  # site key -> its buffer (tap_<i>), the taps this rank answers for
        self.handles = []
        self.register_buffer("fired", torch.zeros(max(1, len(sites)), dtype=torch.long, device=device),
                             persistent=False)
        try:
            for site in sites:
                _check_site(site)
                mine, cols = answering(site, tp_rank=tp_rank, tp_size=tp_size, heads=heads, head_dim=head_dim)
                if not mine or site["key"] in self.index:
                    continue
                i = len(self.index)
                module = model.get_submodule(site["module"])
                width = (cols[1] - cols[0]) if cols else int(site["width"])
                self.register_buffer(f"tap_{i}", torch.zeros(max_tokens, width, dtype=dtype, device=device),
                                     persistent=False)
                self.index[site["key"]] = i
                self.handles.append(_on(module, site, self._copier(i, cols, dtype)))
        except Exception:
            self.remove()
            raise

    def _copier(self, i: int, cols, dtype):
        def copy(x):  # traced into the graph: a fixed-shape in-place copy, and its run counted
            self.fired[i] += 1
            x = x.reshape(-1, x.shape[-1])
            if cols is not None:
                x = x[:, cols[0]:cols[1]]
            getattr(self, f"tap_{i}")[:x.shape[0]].copy_(x.to(dtype))

        return copy

    def buffer(self, key: str):
        return getattr(self, f"tap_{self.index[key]}")

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def _check_site(site) -> None:
    if not isinstance(site, dict):
        raise CaptureError("capture: each site is a map")
    for field, kinds in (("key", str), ("module", str), ("kind", str), ("tensor", str), ("width", int)):
        if not isinstance(site.get(field), kinds) or isinstance(site.get(field), bool):
            raise CaptureError(f"capture.sites: {field} must be a {kinds.__name__}, got {site.get(field)!r}")
    if site["kind"] not in ("pre", "post") or (site.get("head") is not None and not isinstance(site["head"], int)):
        raise CaptureError(f"capture.sites: {site['key']}: not a site steerc reads")


class Capture:
    """One capture in progress on one worker's model."""

    def __init__(self, model, spec: dict, *, tp_rank: int, tp_size: int, heads: int, head_dim: int,
                 taps: Taps | None = None, compiled: bool = False, state=None):
        rows = spec.get("rows")
        if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_ROWS:
            raise CaptureError(f"capture.rows must be a list of 1 to {MAX_ROWS} [start, end] pairs")
        self.ranges = np.asarray(rows, dtype=np.int64).reshape(len(rows), 2)
        if (self.ranges[:, 0] < 0).any() or (self.ranges[:, 1] <= self.ranges[:, 0]).any():
            raise CaptureError("capture.rows: each [start, end) must have 0 <= start < end")
        self.n = len(rows)
        self.per_position = bool(spec.get("per_position", False))
        lengths = self.ranges[:, 1] - self.ranges[:, 0]
        self.offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.total = int(lengths.sum())
        if self.per_position and self.total > MAX_POSITIONS:
            raise CaptureError(f"capture.rows: {self.total} positions, over the {MAX_POSITIONS} a per-position "
                               "capture keeps")
        self.filled = np.zeros(self.total, dtype=bool) if self.per_position else None
        self.model = model
        self.handles = []
        self.sums: dict[str, torch.Tensor] = {}
        self.counts = torch.zeros(self.n, dtype=torch.float64)
        self.seen = np.zeros(self.n, dtype=bool)
        self._step_rows: torch.Tensor | None = None  # per token of this step: its capture row, or -1
        self._step_dest: torch.Tensor | None = None  # per token (per-position captures): its output row, or -1
        self._forced: dict[str, int | None] = {}
        self.taps = taps
        self.tapped: list[tuple[str, object]] = []  # (site key, its reader): read from the taps after a forward
        self._fired = None
        self.failed: str | None = None  # why the capture stopped reading, answered at its end
        self.state = state  # the installed plan's SteerState: its probes' values
        self.probes: list[tuple[str, object]] = []  # (probe name, its reader): read after a forward
        untapped = [s["key"] for s in spec["sites"] if s.get("kind") not in ("logprobs", "probe")
                    and (taps is None or s["key"] not in taps.index)]
        if compiled and untapped:
            held = ", ".join(sorted(taps.index)) if taps is not None and taps.index else "none"
            raise CaptureError(f"capture.sites: {untapped[0]} has no tap in this compiled engine's graph (its taps: "
                               f"{held}); start the engine with load(..., capture=...) naming the sites, or "
                               "enforce_eager=True")
        try:
            for site in spec["sites"]:
                if site.get("kind") == "logprobs":
                    if tp_rank == 0:  # the top-level model's output, outside any compiled graph
                        self.handles.append(model.register_forward_hook(self._reader("logprobs", None)))
                    continue
                if site.get("kind") == "probe":
                    name = site.get("name")
                    if state is None or name not in (*state.pooled, *state.per_token):
                        names = sorted((*state.pooled, *state.per_token)) if state is not None else []
                        raise CaptureError(f"capture.sites: the installed plan has no probe {name!r} (its probes: "
                                           f"{', '.join(names) or 'none'})")
                    if tp_rank == 0:  # a probe reads a whole site, on every rank alike
                        self.probes.append((name, self._reader(site["key"], None)))
                    continue
                mine, cols = answering(site, tp_rank=tp_rank, tp_size=tp_size, heads=heads, head_dim=head_dim)
                if not mine:
                    continue
                if taps is not None and site["key"] in taps.index:
                    self.tapped.append((site["key"], self._reader(site["key"], None)))
                    continue
                module = model.get_submodule(site["module"])
                self.handles.append(_on(module, site, self._reader(site["key"], cols)))
        except Exception:
            self.remove()
            raise

    # ---- per step (called by the plan's feeder before each forward)
    def before(self, layout, view, pos: np.ndarray, row: np.ndarray) -> None:
        """Which of this step's tokens are read, and where they go (called ahead of the forward). A
        refusal ends the capture, never the engine's step: it is answered at ``steerc_capture_end``."""
        if self.failed is None:
            try:
                self._before(layout, view, pos, row)
            except CaptureError as exc:
                self.failed, self._step_rows = str(exc), None

    def _before(self, layout, view, pos: np.ndarray, row: np.ndarray) -> None:
        capture_row = np.full(len(layout.req_ids), -1, dtype=np.int64)
        for i, req in enumerate(layout.req_ids):
            if req not in self._forced:
                self._forced[req] = self._row_of(view.sampling_params(req))
            if self._forced[req] is not None:
                capture_row[i] = self._forced[req]
        rows = capture_row[row]
        inside = rows >= 0
        if inside.any():
            a, b = self.ranges[np.maximum(rows, 0), 0], self.ranges[np.maximum(rows, 0), 1]
            inside &= (pos >= a) & (pos < b)
        rows = np.where(inside, rows, -1)
        if self.per_position:  # where each read token goes: its row's offset plus its place in [a, b)
            safe = np.maximum(rows, 0)
            dest = np.where(rows >= 0, self.offsets[safe] + pos - self.ranges[safe, 0], -1)
            self._step_dest = torch.from_numpy(dest)
            self.filled[dest[dest >= 0]] = True
        if (rows >= 0).any():
            self._step_rows = torch.from_numpy(rows)
            if self.tapped:
                self._fired = self.taps.fired.clone()
            taken = rows[rows >= 0]
            self.seen[taken] = True
            self.counts += torch.bincount(torch.from_numpy(taken), minlength=self.n).to(torch.float64)
        else:
            self._step_rows = None

    def after(self) -> None:
        """After a forward: the tapped sites' rows of this step, read out of the taps' buffers."""
        if self.failed is None:
            try:
                self._after()
            except CaptureError as exc:
                self.failed = str(exc)

    def idle(self) -> None:
        """A forward that runs no request (a dummy run): nothing of it is read."""
        self._step_rows, self._fired = None, None

    def _after(self) -> None:
        if self._step_rows is None:
            return
        n = len(self._step_rows)
        for name, read in self.probes:
            read(self.state.probe_value(name, n).unsqueeze(-1))
        if not self.tapped:
            return
        fired, self._fired = self._fired, None
        now = self.taps.fired
        for key, read in self.tapped:
            i = self.taps.index[key]
            if fired is not None and int(now[i]) <= int(fired[i]):
                raise CaptureError(f"capture: the tap at {key} did not run in a step it was to read; the "
                                   "engine's forward does not go through its module")
            read(self.taps.buffer(key))

    def _row_of(self, params) -> int | None:
        extra = getattr(params, "extra_args", None) or {}
        if CAPTURE_KEY not in extra:
            return None
        value = extra[CAPTURE_KEY]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.n:
            raise CaptureError(f"extra_args.{CAPTURE_KEY} must be a row of the capture, 0 to {self.n - 1}, "
                               f"got {value!r}")
        return value

    # ---- the hooks
    def _reader(self, key: str, cols):
        """What a hook calls with its site's tensor: summed per row, or kept per position."""

        def read(x: torch.Tensor) -> None:
            rows = self._step_rows
            if rows is None:
                return
            x = x[: len(rows)]
            if cols is not None:
                x = x[..., cols[0]:cols[1]]
            keep = rows >= 0
            values = x[keep.to(x.device)]
            if self.per_position:
                kept = self.sums.get(key)
                if kept is None:
                    kept = self.sums[key] = torch.zeros(self.total, x.shape[-1], dtype=x.dtype, device=x.device)
                kept[self._step_dest[keep].to(x.device)] = values
                return
            total = self.sums.get(key)
            if total is None:
                total = self.sums[key] = torch.zeros(self.n, x.shape[-1], dtype=torch.float64)
            total.index_add_(0, rows[keep], values.to(torch.float64).cpu())

        def hook(mod, args, output):  # the top-level model's output: its final hidden states
            read(output[0] if isinstance(output, tuple) else output)

        return hook if key == "logprobs" else read

    def result(self) -> dict:
        """{"rows", "missing", "sites": {key: {"shape", "data"}}}: each row's mean (or each position's
        value), float32 bytes."""
        missing = [int(i) for i in np.flatnonzero(~self.seen)]
        if self.per_position and not self.filled.all():
            missing = sorted(set(missing) | {int(np.searchsorted(self.offsets, i, side="right") - 1)
                                             for i in np.flatnonzero(~self.filled)})
        counts = self.counts.clamp(min=1).unsqueeze(1)
        sites = {}
        for key, total in sorted(self.sums.items()):
            if key == "logprobs":
                with torch.no_grad():
                    logits = self.model.compute_logits(total)
                value = torch.log_softmax(logits.to(torch.float32), dim=-1).cpu().numpy()
            elif self.per_position:
                value = total.to(torch.float32).cpu().numpy()
            else:
                value = (total / counts).to(torch.float32).numpy()
            sites[key] = {"shape": list(value.shape), "data": value.tobytes()}
        return {"rows": self.n, "missing": missing, "counts": self.counts.tolist(), "sites": sites}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
