"""A CPU stand-in for vLLM 0.33 (llama only), for testing steerc's vLLM worker extension.

vLLM cannot be installed here. This module rebuilds the parts of it that steering hooks touch,
with vLLM's module names, call signatures, tensor layouts and batching, so that hooks written
for vLLM run unchanged on CPU and their results can be compared with Hugging Face. Paths in the
comments refer to the vLLM 0.33.0 source (see /work/notes/vllm.md).

Layers (each mirrors the vLLM class of the same name):

* the model: :class:`VllmLlamaForCausalLM` (``model_executor/models/llama.py``), built from an HF
  ``LlamaForCausalLM`` by :func:`from_hf`, optionally as one tensor/pipeline-parallel rank;
* the forward context: :func:`get_forward_context` (``vllm/forward_context.py``), set per step;
* tensor/pipeline parallelism in one process: :class:`TensorParallelGroup` (ranks of one stage
  run in lockstep threads; RowParallel layers all-reduce through it) and :class:`PipelineGroup`;
* the V2 model runner :class:`GPUModelRunner` (``v1/worker/gpu/model_runner.py``) with
  :class:`RequestState` and :class:`InputBatch`, and the :class:`Worker`
  (``v1/worker/gpu_worker.py``) with vLLM's worker-extension mix-in (:func:`extend_worker_class`);
* :func:`collective_rpc` with vLLM's msgpack hop, and :class:`StandinEngine`, a continuous-batching
  scheduler with greedy sampling.

Typical use::

    workers = make_workers(tiny_model("llama"), tp_size=2, extension_cls=MyExtension)
    engine = StandinEngine(workers, chunk=4)
    engine.add_request("a", [5, 6, 7], max_tokens=4, extra_args={"steer": "x"})
    records = engine.run()          # req_id -> RequestRecord(output_token_ids, logits, ...)
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import msgpack
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

VLLM_VERSION = "0.33.0"
PAD_TOKENS_TO = 8  # the padded batch size is a multiple of this, as with CUDA-graph sizes

# Per-thread state. In vLLM every rank is a process with its own globals; here ranks are threads.
_tls = threading.local()


# --------------------------------------------------------------------------------------------
# Parallel state: vllm.distributed (parallel_state.py) for the rank that is running right now
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupCoordinator:
    """The slice of vLLM's ``GroupCoordinator`` that model code reads (parallel_state.py:651-658)."""

    rank_in_group: int
    world_size: int

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1


@contextlib.contextmanager
def worker_scope(worker: Worker) -> Iterator[None]:
    """Make ``worker`` the current rank of this thread (what its process would be in vLLM)."""
    previous = getattr(_tls, "worker", None)
    _tls.worker = worker
    try:
        yield
    finally:
        _tls.worker = previous


def _current_worker() -> Worker:
    worker = getattr(_tls, "worker", None)
    assert worker is not None, "parallel groups are only initialised inside a worker (use worker_scope)"
    return worker


def get_tp_group() -> GroupCoordinator:
    w = _current_worker()
    return GroupCoordinator(w.tp_rank, w.parallel_config.tensor_parallel_size)


def get_pp_group() -> GroupCoordinator:
    w = _current_worker()
    return GroupCoordinator(w.pp_rank, w.parallel_config.pipeline_parallel_size)


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_pipeline_model_parallel_rank() -> int:
    return get_pp_group().rank_in_group


class TensorParallelGroup:
    """``world_size`` tensor-parallel ranks of one pipeline stage, run in lockstep threads.

    Every ``RowParallelLinear`` of a rank holds a reference to its group and calls
    :meth:`all_reduce` with its partial output; the call returns once all ranks have contributed,
    with the sum taken in rank order (so all ranks get bit-identical results, as after NCCL).
    Run the ranks' forwards through :meth:`run`; a sharded model called on its own would wait.
    """

    def __init__(self, world_size: int, timeout_s: float = 60.0):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._barrier = threading.Barrier(world_size)
        self._slots: list[torch.Tensor | None] = [None] * world_size
        self._inside = threading.local()

    def all_reduce(self, tensor: torch.Tensor, rank: int) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        if not getattr(self._inside, "flag", False):
            raise RuntimeError("all_reduce outside TensorParallelGroup.run: run all ranks through the group")
        self._slots[rank] = tensor
        self._barrier.wait(self.timeout_s)  # every rank has deposited its partial
        total = self._slots[0]
        for part in self._slots[1:]:
            total = total + part
        self._barrier.wait(self.timeout_s)  # every rank has read before the slots are reused
        return total

    def run(self, fns: Sequence[Callable[[], Any]]) -> list[Any]:
        """Call ``fns[r]`` as rank r, all ranks concurrently; return their results in rank order."""
        if len(fns) != self.world_size:
            raise ValueError(f"expected {self.world_size} rank functions, got {len(fns)}")
        if self.world_size == 1:
            return [fns[0]()]
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException | None] = [None] * self.world_size

        def target(rank: int) -> None:
            self._inside.flag = True
            try:
                results[rank] = fns[rank]()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors[rank] = exc
                self._barrier.abort()  # release the other ranks instead of deadlocking

        threads = [threading.Thread(target=target, args=(r,), name=f"tp-rank-{r}") for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._barrier.broken:
            self._barrier.reset()
        self._slots = [None] * self.world_size
        real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
        if real or any(errors):
            raise (real or [e for e in errors if e is not None])[0]
        return results


class PipelineGroup:
    """``pp_size`` pipeline stages, each a :class:`TensorParallelGroup`, run one after another.

    A stage's output (an :class:`IntermediateTensors` with ``hidden_states`` and ``residual``) is the
    next stage's input. Unlike vLLM there is one batch in flight at a time (no micro-batch overlap).
    """

    def __init__(self, pp_size: int, tp_size: int = 1):
        self.pp_size = pp_size
        self.tp_size = tp_size
        self.tp_groups = [TensorParallelGroup(tp_size) for _ in range(pp_size)]

    def run(self, stage_fn: Callable[[int, int, Any], Any]) -> list[Any]:
        """``stage_fn(pp_rank, tp_rank, intermediate)`` for every rank; the last stage's results."""
        intermediate = None
        outputs: list[Any] = []
        for p, group in enumerate(self.tp_groups):
            outputs = group.run([lambda p=p, t=t, x=intermediate: stage_fn(p, t, x) for t in range(self.tp_size)])
            intermediate = outputs[0]  # identical on every TP rank after the all-reduces
        return outputs


# --------------------------------------------------------------------------------------------
# Forward context: vllm/forward_context.py and the attention metadata the runner builds
# --------------------------------------------------------------------------------------------


@dataclass
class AttentionMetadata:
    """Per-step attention metadata (FlashAttention's fields, flash_attn.py:518-560), CPU tensors.

    The KV cache has one block per request slot (``block_size = max_model_len``): request i of the
    batch reads block ``block_table[i]`` and token t writes flat slot ``slot_mapping[t]``
    (``block * block_size + position``; ``-1`` for padding tokens, which write nothing).
    """

    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32: computed + scheduled tokens
    block_table: torch.Tensor  # [num_reqs] int64: the request's slot (= its KV block)
    slot_mapping: torch.Tensor  # [num_tokens_after_padding] int64


@dataclass
class BatchDescriptor:
    num_tokens: int


@dataclass
class ForwardContext:
    """What ``get_forward_context()`` returns during a forward (forward_context.py:141-203)."""

    attn_metadata: dict[str, AttentionMetadata] | None  # layer name -> metadata; None in profile runs
    slot_mapping: dict[str, torch.Tensor] | None
    is_padding: torch.Tensor | None = None  # [num_tokens_after_padding] bool
    batch_descriptor: BatchDescriptor | None = None
    additional_kwargs: dict[str, Any] = field(default_factory=dict)


def get_forward_context() -> ForwardContext:
    ctx = getattr(_tls, "forward_context", None)
    assert ctx is not None, (
        "Forward context is not set. Please use `set_forward_context` to set the forward context."
    )
    return ctx


def is_forward_context_available() -> bool:
    return getattr(_tls, "forward_context", None) is not None


@contextlib.contextmanager
def set_forward_context(ctx: ForwardContext) -> Iterator[None]:
    previous = getattr(_tls, "forward_context", None)
    _tls.forward_context = ctx
    try:
        yield
    finally:
        _tls.forward_context = previous


class IntermediateTensors:
    """What a non-last pipeline rank returns (vllm/sequence.py:12)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def __getitem__(self, key: str | slice):
        if isinstance(key, str):
            return self.tensors[key]
        return IntermediateTensors({k: v[key] for k, v in self.tensors.items()})

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.tensors[key] = value

    def items(self):
        return self.tensors.items()

    def keys(self):
        return self.tensors.keys()

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return f"IntermediateTensors(tensors={ {k: tuple(v.shape) for k, v in self.tensors.items()} })"


# --------------------------------------------------------------------------------------------
# Layers: model_executor/layers/{linear,layernorm,activation,rotary_embedding,...}.py
# --------------------------------------------------------------------------------------------


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)


class LinearBase(nn.Module):
    """Shared attributes of vLLM's parallel linears (linear.py:245-330). ``forward -> (out, None)``."""

    def __init__(self, input_size: int, output_size: int, *, tp_rank: int, tp_size: int, prefix: str):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.prefix = prefix
        self.skip_bias_add = False
        self.return_bias = True


class ColumnParallelLinear(LinearBase):
    """Output columns split contiguously over TP ranks; this rank holds ``output_size // tp_size``."""

    def __init__(self, input_size: int, output_size: int, *, bias: bool, dtype: torch.dtype,
                 tp_rank: int = 0, tp_size: int = 1, prefix: str = ""):
        super().__init__(input_size, output_size, tp_rank=tp_rank, tp_size=tp_size, prefix=prefix)
        self.input_size_per_partition = input_size
        self.output_size_per_partition = self._local_output_size()
        self.weight = _param(self.output_size_per_partition, input_size, dtype=dtype)
        self.bias = _param(self.output_size_per_partition, dtype=dtype) if bias else None

    def _local_output_size(self) -> int:
        return self.output_size // self.tp_size

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return F.linear(x, self.weight, self.bias), None

    def extra_repr(self) -> str:
        return f"in_features={self.input_size}, output_features={self.output_size_per_partition}, " \
               f"bias={self.bias is not None}, tp_size={self.tp_size}"


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul; per rank ``[part0_local | part1_local]``."""

    def __init__(self, input_size: int, output_sizes: list[int], **kw):
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), **kw)


class QKVParallelLinear(ColumnParallelLinear):
    """Merged q/k/v projection (linear.py:1011-1089); per rank ``[q_local | k_local | v_local]``."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int,
                 *, tp_size: int = 1, **kw):
        self.hidden_size = hidden_size
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = total_num_heads // tp_size
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = tp_size // total_num_kv_heads
        else:
            self.num_kv_heads = total_num_kv_heads // tp_size
            self.num_kv_head_replicas = 1
        output_size = (total_num_heads + 2 * total_num_kv_heads) * head_size
        super().__init__(hidden_size, output_size, tp_size=tp_size, **kw)

    def _local_output_size(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_size


class RowParallelLinear(LinearBase):
    """Input columns split over TP ranks (linear.py:1653-1825).

    The input is already this rank's shard (``input_is_parallel``). The bias is added on rank 0
    only; the partial outputs are then all-reduced, so the output is the same on every rank.
    """

    def __init__(self, input_size: int, output_size: int, *, bias: bool, dtype: torch.dtype,
                 tp_rank: int = 0, tp_size: int = 1, tp_group: TensorParallelGroup | None = None,
                 prefix: str = ""):
        super().__init__(input_size, output_size, tp_rank=tp_rank, tp_size=tp_size, prefix=prefix)
        self.input_size_per_partition = input_size // tp_size
        self.output_size_per_partition = output_size
        self.input_is_parallel = True
        self.reduce_results = True
        self.tp_group = tp_group
        self.weight = _param(output_size, self.input_size_per_partition, dtype=dtype)
        self.bias = _param(output_size, dtype=dtype) if bias else None

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, None]:
        bias = None if self.tp_rank > 0 else self.bias
        output = F.linear(input_, self.weight, bias)
        if self.reduce_results and self.tp_size > 1:
            if self.tp_group is None:
                raise RuntimeError(f"{self.prefix}: tp_size={self.tp_size} but no TensorParallelGroup attached")
            output = self.tp_group.all_reduce(output, self.tp_rank)
        return output, None

    def extra_repr(self) -> str:
        return f"in_features={self.input_size_per_partition}, output_features={self.output_size}, " \
               f"bias={self.bias is not None}, tp_size={self.tp_size}, reduce_results={self.reduce_results}"


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """ir/ops/layernorm.py:rms_norm: normalise in float32, multiply by the weight, cast back."""
    orig_dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x32.to(weight.dtype) * weight).to(orig_dtype)


class RMSNorm(nn.Module):
    """``RMSNorm(x) -> normed``; ``RMSNorm(x, residual) -> (norm(x + residual), x + residual)``.

    The fused form is vLLM's ``fused_add_rms_norm`` (ir/ops/layernorm.py:44-62), but out of place:
    on CUDA vLLM overwrites ``x`` and ``residual`` with the two results. vLLM adds in float32; here
    the add runs in ``promote(dtype, float32)`` so that float64 models stay exact.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return _rms_norm(x, self.weight, self.variance_epsilon)
        orig_dtype = x.dtype
        wide = torch.promote_types(orig_dtype, torch.float32)
        total = x.to(wide) + residual.to(wide)
        return _rms_norm(total, self.weight, self.variance_epsilon).to(orig_dtype), total.to(orig_dtype)

    def extra_repr(self) -> str:
        return f"hidden_size={self.weight.shape[0]}, eps={self.variance_epsilon}"


class SiluAndMul(nn.Module):
    """``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2`` (activation.py:116-144)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE with a float32 ``cos_sin_cache`` (rotary_embedding/base.py), default rope only.

    ``forward(positions, query, key)`` takes flattened ``[T, heads * head_size]`` q/k.
    """

    def __init__(self, head_size: int, max_position: int, base: float, *, dtype: torch.dtype):
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = head_size
        self.max_position_embeddings = max_position
        self.base = base
        self.is_neox_style = True
        inv_freq = 1.0 / (base ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float) / self.rotary_dim))
        t = torch.arange(max_position, dtype=torch.float)
        freqs = torch.einsum("i,j -> ij", t, inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(x.shape[0], -1, self.head_size)
        x1, x2 = torch.chunk(x, 2, dim=-1)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).reshape(shape)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        cos_sin = self.cos_sin_cache.index_select(0, positions.flatten())
        cos, sin = cos_sin.chunk(2, dim=-1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)


class Attention(nn.Module):
    """Causal (GQA) attention over a paged KV cache, like vLLM's ``Attention`` layer.

    ``forward(q, k, v)`` takes ``[T, heads * head_size]`` and returns ``[T, num_heads * head_size]``,
    the concatenation of this rank's heads (head-major), which is ``o_proj``'s input. The metadata
    comes from ``get_forward_context().attn_metadata[self.layer_name]``; the cache
    ``self.kv_cache`` (``[2, num_blocks, block_size, num_kv_heads, head_size]``) is bound by the
    runner. New keys/values are written first, then each request attends to its own
    ``seq_len`` cached tokens. Padding rows write nothing and output zeros.
    """

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, prefix: str):
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.layer_name = prefix
        self.kv_cache = torch.empty(0)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        num_tokens = query.shape[0]
        output = query.new_zeros(num_tokens, self.num_heads, self.head_size)
        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is None:  # profile run (vLLM skips attention there)
            return output.view(num_tokens, -1)
        md = attn_metadata[self.layer_name]
        q = query.reshape(num_tokens, self.num_heads, self.head_size)
        k = key.reshape(num_tokens, self.num_kv_heads, self.head_size)
        v = value.reshape(num_tokens, self.num_kv_heads, self.head_size)

        key_cache, value_cache = self.kv_cache.unbind(0)
        n, slots = md.num_actual_tokens, md.slot_mapping[: md.num_actual_tokens]
        key_cache.view(-1, self.num_kv_heads, self.head_size).index_copy_(0, slots, k[:n])
        value_cache.view(-1, self.num_kv_heads, self.head_size).index_copy_(0, slots, v[:n])

        group = self.num_heads // self.num_kv_heads
        qsl, seq_lens, blocks = md.query_start_loc.tolist(), md.seq_lens.tolist(), md.block_table.tolist()
        for i in range(md.num_reqs):
            start, end, seq_len = qsl[i], qsl[i + 1], seq_lens[i]
            keys = key_cache[blocks[i], :seq_len].repeat_interleave(group, dim=1)  # [L, H, d]
            values = value_cache[blocks[i], :seq_len].repeat_interleave(group, dim=1)
            q_pos = torch.arange(seq_len - (end - start), seq_len)
            causal = torch.arange(seq_len)[None, :] <= q_pos[:, None]
            out = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                attn_mask=causal, scale=self.scale,
            )
            output[start:end] = out.transpose(0, 1)
        return output.view(num_tokens, -1)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}"


class VocabParallelEmbedding(nn.Module):
    """Token embedding. Simplification: not vocab-sharded (vLLM shards it and all-reduces)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = _param(num_embeddings, embedding_dim, dtype=dtype)

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    """Holds the LM-head weight; calling it raises, as in vLLM (hooks on ``lm_head`` never fire)."""

    def forward(self, input_):
        del input_
        raise RuntimeError("LMHead's weights should be used in the sampler.")


class LogitsProcessor(nn.Module):
    """``logits_processor(lm_head, hidden_states) -> logits`` (logits_processor.py). Hookable."""

    def __init__(self, vocab_size: int, scale: float = 1.0):
        super().__init__()
        self.vocab_size = vocab_size
        self.scale = scale

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden_states, lm_head.weight)
        return logits * self.scale if self.scale != 1.0 else logits


class PPMissingLayer(nn.Identity):
    """Placeholder for a module another pipeline rank owns; returns its first argument (utils.py:852)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, *args, **kwargs):
        return args[0] if args else next(iter(kwargs.values()))


def get_pp_indices(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """distributed/utils.py:198-241 (without the VLLM_PP_LAYER_PARTITION override)."""
    partitions = [num_hidden_layers // pp_size] * pp_size
    for i in range(2, num_hidden_layers % pp_size + 2):
        partitions[-i] += 1
    start = sum(partitions[:pp_rank])
    return start, start + partitions[pp_rank]


def make_layers(num_hidden_layers: int, layer_fn: Callable[[str], nn.Module], prefix: str,
                pp_rank: int = 0, pp_size: int = 1) -> tuple[int, int, nn.ModuleList]:
    """models/utils.py:886-919: real layers for this pipeline rank, PPMissingLayer elsewhere."""
    start, end = get_pp_indices(num_hidden_layers, pp_rank, pp_size)
    modules = nn.ModuleList(
        [PPMissingLayer() for _ in range(start)]
        + [layer_fn(f"{prefix}.{i}") for i in range(start, end)]
        + [PPMissingLayer() for _ in range(end, num_hidden_layers)]
    )
    return start, end, modules


# --------------------------------------------------------------------------------------------
# The llama model: model_executor/models/llama.py
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Parallel:
    tp_size: int = 1
    tp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    tp_group: TensorParallelGroup | None = None


class LlamaMLP(nn.Module):
    def __init__(self, config, par: _Parallel, dtype: torch.dtype, prefix: str):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        tp = dict(tp_rank=par.tp_rank, tp_size=par.tp_size, dtype=dtype)
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=bias, prefix=f"{prefix}.gate_up_proj", **tp)
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=bias, tp_group=par.tp_group,
            prefix=f"{prefix}.down_proj", **tp)
        if config.hidden_act != "silu":
            raise ValueError(f"Unsupported activation: {config.hidden_act}. Only silu is supported for now.")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, _ = self.gate_up_proj(x)
        x = self.act_fn(x)
        x, _ = self.down_proj(x)
        return x


class LlamaAttention(nn.Module):
    def __init__(self, config, par: _Parallel, dtype: torch.dtype, prefix: str, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = getattr(config, "num_key_value_heads", None) or self.total_num_heads
        assert self.total_num_heads % par.tp_size == 0
        if self.total_num_kv_heads >= par.tp_size:
            assert self.total_num_kv_heads % par.tp_size == 0
        else:
            assert par.tp_size % self.total_num_kv_heads == 0
        self.num_heads = self.total_num_heads // par.tp_size
        self.num_kv_heads = max(1, self.total_num_kv_heads // par.tp_size)
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // self.total_num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scaling = self.head_dim**-0.5
        bias = bool(getattr(config, "attention_bias", False))
        tp = dict(tp_rank=par.tp_rank, tp_size=par.tp_size, dtype=dtype)
        self.qkv_proj = QKVParallelLinear(
            self.hidden_size, self.head_dim, self.total_num_heads, self.total_num_kv_heads,
            bias=bias, prefix=f"{prefix}.qkv_proj", **tp)
        self.o_proj = RowParallelLinear(
            self.total_num_heads * self.head_dim, self.hidden_size, bias=bias, tp_group=par.tp_group,
            prefix=f"{prefix}.o_proj", **tp)
        self.rotary_emb = rotary_emb  # one module shared by all layers, as get_rope caches it
        self.attn = Attention(self.num_heads, self.head_dim, self.scaling, self.num_kv_heads, prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        attn_output = self.attn(q, k, v)
        output, _ = self.o_proj(attn_output)
        return output


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, par: _Parallel, dtype: torch.dtype, prefix: str, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.self_attn = LlamaAttention(config, par, dtype, f"{prefix}.self_attn", rotary_emb)
        self.mlp = LlamaMLP(config, par, dtype, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None):
        """``-> (mlp_out, stream after attention)``; the stream leaving the layer is their sum."""
        if residual is None:  # layer 0 on the first pipeline rank
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


class LlamaModel(nn.Module):
    """The decoder stack. Like vLLM's ``@support_torch_compile`` class, calling it skips
    ``nn.Module.__call__``, so hooks registered on ``model.model`` itself never fire."""

    def __init__(self, config, par: _Parallel, dtype: torch.dtype, prefix: str = "model"):
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.pp_rank, self.pp_size = par.pp_rank, par.pp_size
        first, last = par.pp_rank == 0, par.pp_rank == par.pp_size - 1
        if first or (config.tie_word_embeddings and last):
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype=dtype)
        else:
            self.embed_tokens = PPMissingLayer()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rope = getattr(config, "rope_parameters", None) or {"rope_type": "default",
                                                            "rope_theta": getattr(config, "rope_theta", 10000.0)}
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"stand-in supports default RoPE only, not {rope['rope_type']!r}")
        rotary_emb = RotaryEmbedding(head_dim, getattr(config, "max_position_embeddings", 8192),
                                     float(rope["rope_theta"]), dtype=dtype)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda layer_prefix: LlamaDecoderLayer(config, par, dtype, layer_prefix, rotary_emb),
            prefix=f"{prefix}.layers", pp_rank=par.pp_rank, pp_size=par.pp_size,
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype) if last else PPMissingLayer()

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)  # no hooks, as with support_torch_compile (decorators.py:533-538)

    @property
    def is_first_rank(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def make_empty_intermediate_tensors(self, batch_size: int, dtype: torch.dtype, device) -> IntermediateTensors:
        shape = (batch_size, self.config.hidden_size)
        return IntermediateTensors({k: torch.zeros(shape, dtype=dtype, device=device)
                                    for k in ("hidden_states", "residual")})

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        if self.is_first_rank:
            hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
        if not self.is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class VllmLlamaForCausalLM(nn.Module):
    """vLLM's ``LlamaForCausalLM`` module tree (llama.py:464-561), for one TP/PP rank.

    ``forward(input_ids, positions, intermediate_tensors=None, inputs_embeds=None)`` takes the
    flattened tokens of all requests (``[num_tokens]``, no batch dim) and returns hidden states
    ``[num_tokens, hidden]`` after the final norm (last PP rank) or an :class:`IntermediateTensors`
    with ``hidden_states`` and ``residual`` (other ranks). Needs a forward context (see the runner).
    """

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, config, *, dtype: torch.dtype = torch.float32, tp_size: int = 1, tp_rank: int = 0,
                 pp_size: int = 1, pp_rank: int = 0, tp_group: TensorParallelGroup | None = None):
        super().__init__()
        par = _Parallel(tp_size, tp_rank, pp_size, pp_rank, tp_group)
        self.config = config
        self.dtype = dtype
        self.model = LlamaModel(config, par, dtype, prefix="model")
        if pp_rank == pp_size - 1:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype=dtype)
            if config.tie_word_embeddings:
                self.lm_head.weight = self.model.embed_tokens.weight
            self.logits_processor = LogitsProcessor(config.vocab_size, scale=getattr(config, "logit_scale", 1.0))
        else:
            self.lm_head = PPMissingLayer()
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)


@torch.no_grad()
def from_hf(hf_model, tp_size: int = 1, tp_rank: int = 0, pp_size: int = 1, pp_rank: int = 0,
            tp_group: TensorParallelGroup | None = None) -> VllmLlamaForCausalLM:
    """The stand-in for one TP/PP rank, with the weights of an HF ``LlamaForCausalLM`` (copied).

    q/k/v are stacked into ``qkv_proj`` and gate/up into ``gate_up_proj``, as vLLM's loader does.
    Rank r holds query heads ``[r*H/tp, (r+1)*H/tp)`` with their KV heads (replicated when
    ``KV < tp``) and intermediate channels ``[r*I/tp, (r+1)*I/tp)``; ``o_proj``/``down_proj`` hold the
    matching input columns. With ``tp_size > 1`` pass the stage's :class:`TensorParallelGroup`.
    """
    cfg = hf_model.config
    dtype = next(hf_model.parameters()).dtype
    model = VllmLlamaForCausalLM(cfg, dtype=dtype, tp_size=tp_size, tp_rank=tp_rank,
                                 pp_size=pp_size, pp_rank=pp_rank, tp_group=tp_group)
    hf = hf_model.model
    if isinstance(model.model.embed_tokens, VocabParallelEmbedding):
        model.model.embed_tokens.weight.copy_(hf.embed_tokens.weight)
    if model.model.is_last_rank:
        model.model.norm.weight.copy_(hf.norm.weight)
        model.lm_head.weight.copy_(hf_model.lm_head.weight)

    def rows(t: torch.Tensor | None, start: int, size: int):
        return None if t is None else t[start: start + size]

    def copy_linear(dst, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        dst.weight.copy_(weight)
        if dst.bias is not None:
            dst.bias.copy_(bias)

    for i in range(model.model.start_layer, model.model.end_layer):
        src, dst = hf.layers[i], model.model.layers[i]
        attn, a = src.self_attn, dst.self_attn
        d, hl, kvl = a.head_dim, a.num_heads, a.num_kv_heads
        kv_start = (tp_rank // a.qkv_proj.num_kv_head_replicas) * kvl
        parts = [(attn.q_proj, tp_rank * hl * d, hl * d), (attn.k_proj, kv_start * d, kvl * d),
                 (attn.v_proj, kv_start * d, kvl * d)]
        copy_linear(a.qkv_proj, torch.cat([rows(p.weight, s, n) for p, s, n in parts]),
                    None if attn.q_proj.bias is None else torch.cat([rows(p.bias, s, n) for p, s, n in parts]))
        copy_linear(a.o_proj, attn.o_proj.weight[:, tp_rank * hl * d: (tp_rank + 1) * hl * d], attn.o_proj.bias)

        mlp, m = src.mlp, dst.mlp
        il = cfg.intermediate_size // tp_size
        gate_up = [(mlp.gate_proj, tp_rank * il, il), (mlp.up_proj, tp_rank * il, il)]
        copy_linear(m.gate_up_proj, torch.cat([rows(p.weight, s, n) for p, s, n in gate_up]),
                    None if mlp.gate_proj.bias is None else torch.cat([rows(p.bias, s, n) for p, s, n in gate_up]))
        copy_linear(m.down_proj, mlp.down_proj.weight[:, tp_rank * il: (tp_rank + 1) * il], mlp.down_proj.bias)

        dst.input_layernorm.weight.copy_(src.input_layernorm.weight)
        dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)
    return model.eval()


def attention_layers(model: nn.Module) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]


def _bind_kv_cache(model: nn.Module, num_blocks: int, block_size: int) -> list[torch.Tensor]:
    caches = []
    for attn in attention_layers(model):
        attn.kv_cache = torch.zeros(2, num_blocks, block_size, attn.num_kv_heads, attn.head_size,
                                    dtype=model.dtype)
        caches.append(attn.kv_cache)
    return caches


def _attn_metadata(model: nn.Module, md: AttentionMetadata) -> dict[str, AttentionMetadata]:
    return {attn.layer_name: md for attn in attention_layers(model)}


@torch.no_grad()
def forward_batch(model: VllmLlamaForCausalLM, prompts: Sequence[Sequence[int]],
                  intermediate_tensors: IntermediateTensors | None = None):
    """One prefill forward of ``prompts`` (flattened, no padding), outside any engine.

    Uses a temporary KV cache (the model's own cache is restored afterwards). Returns what the
    model returns: hidden states ``[num_tokens, hidden]`` or, off the last PP rank,
    :class:`IntermediateTensors`. Non-first PP ranks need the previous rank's ``intermediate_tensors``.
    """
    lens = [len(p) for p in prompts]
    block_size = max(lens)
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lens])
    blocks = torch.arange(len(prompts))
    md = AttentionMetadata(
        num_actual_tokens=sum(lens), num_reqs=len(prompts), max_query_len=block_size, query_start_loc=qsl,
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_table=blocks,
        slot_mapping=torch.repeat_interleave(blocks, torch.tensor(lens)) * block_size + positions,
    )
    saved = [a.kv_cache for a in attention_layers(model)]
    _bind_kv_cache(model, len(prompts), block_size)
    input_ids = torch.tensor([t for p in prompts for t in p]) if model.model.is_first_rank else None
    ctx = ForwardContext(attn_metadata=_attn_metadata(model, md), slot_mapping=None,
                         is_padding=torch.zeros(sum(lens), dtype=torch.bool),
                         batch_descriptor=BatchDescriptor(sum(lens)))
    try:
        with set_forward_context(ctx):
            return model(input_ids, positions, intermediate_tensors)
    finally:
        for attn, cache in zip(attention_layers(model), saved):
            attn.kv_cache = cache


# --------------------------------------------------------------------------------------------
# Config, scheduler output, request state and input batch (v1/core/sched/output.py, v1/worker/gpu/)
# --------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    hf_config: Any
    dtype: torch.dtype
    max_model_len: int
    model: str = "tiny-llama"


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 8


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    worker_extension_cls: str = ""

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass
class VllmConfig:
    model_config: ModelConfig
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    additional_config: dict = field(default_factory=dict)


@dataclass
class SamplingParams:
    """Greedy only. ``extra_args`` is vLLM's free-form per-request dict (sampling_params.py:415)."""

    max_tokens: int = 16
    extra_args: dict[str, Any] | None = None


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    num_computed_tokens: int = 0
    prefill_token_ids: list[int] | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    # Tokens sampled since the request was last scheduled. vLLM V2 keeps them on the GPU
    # (last_sampled_tokens); here the scheduler hands them to every rank, as V1 does under PP.
    new_token_ids: list[list[int]] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str] = field(default_factory=set)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    preempted_req_ids: set[str] | None = None


class CpuBackedTensor:
    """vLLM's ``UvaBackedTensor``: ``.np`` (numpy), ``.cpu`` and ``.gpu`` share one CPU buffer here."""

    def __init__(self, size, dtype: torch.dtype):
        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = self.cpu


class RequestState:
    """Persistent per-slot request state (v1/worker/gpu/states.py).

    Slots come from ``free_indices.pop()`` (so the first request gets the highest index) and a
    finished request's slot is appended back and reused next. ``extra_args`` (the request's
    ``SamplingParams.extra_args`` by slot) is a stand-in addition: vLLM keeps no such array.
    """

    def __init__(self, max_num_reqs: int, max_model_len: int, max_num_batched_tokens: int, vocab_size: int):
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.vocab_size = vocab_size
        self.req_id_to_index: dict[str, int] = {}
        self.index_to_req_id: dict[int, str] = {}
        self.free_indices = list(range(max_num_reqs))
        self.all_token_ids = CpuBackedTensor((max_num_reqs, max_model_len), torch.int32)
        self.prompt_len = CpuBackedTensor(max_num_reqs, torch.int32)
        self.prefill_len = CpuBackedTensor(max_num_reqs, torch.int32)
        self.total_len = CpuBackedTensor(max_num_reqs, torch.int32)
        self.num_computed_prefill_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_np = np.zeros(max_num_reqs, dtype=np.int32)
        self.max_seq_len = np.zeros(max_num_reqs, dtype=np.int32)
        self.extra_args: list[dict[str, Any] | None] = [None] * max_num_reqs

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, req_id: str, prompt_len: int, all_token_ids: list[int], num_computed_tokens: int,
                    max_tokens: int, extra_args: dict[str, Any] | None = None) -> None:
        assert len(self.free_indices) > 0, "No free indices"
        idx = self.free_indices.pop()
        self.req_id_to_index[req_id] = idx
        self.index_to_req_id[idx] = req_id
        self.max_seq_len[idx] = prompt_len + max_tokens
        self.prompt_len.np[idx] = prompt_len
        self.prefill_len.np[idx] = len(all_token_ids)
        self.total_len.np[idx] = len(all_token_ids)
        self.all_token_ids.np[idx, : len(all_token_ids)] = all_token_ids
        self.num_computed_prefill_tokens[idx] = num_computed_tokens
        self.num_computed_tokens_np[idx] = num_computed_tokens
        self.extra_args[idx] = extra_args

    def append_token_ids(self, idx: int, token_ids: list[int]) -> None:
        start = int(self.total_len.np[idx])
        self.all_token_ids.np[idx, start: start + len(token_ids)] = token_ids
        self.total_len.np[idx] = start + len(token_ids)

    def remove_request(self, req_id: str) -> int | None:
        idx = self.req_id_to_index.pop(req_id, None)
        if idx is None:
            return None
        self.index_to_req_id.pop(idx, None)
        self.extra_args[idx] = None
        self.free_indices.append(idx)
        return idx


class InputBuffers:
    """Persistent input buffers (input_batch.py:23-39): padding rows keep stale values, as in vLLM."""

    def __init__(self, max_num_reqs: int, max_num_tokens: int):
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.input_ids = torch.zeros(max_num_tokens, dtype=torch.int32)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.int64)
        self.is_padding = torch.zeros(max_num_tokens, dtype=torch.bool)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int32)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32)


@dataclass
class BatchReqState:
    req_ids: list[str]
    num_scheduled_tokens: np.ndarray
    num_tokens: int
    idx_mapping_np: np.ndarray
    prefill_len_np: np.ndarray
    num_computed_prefill_tokens_np: np.ndarray
    is_prefilling_np: np.ndarray
    has_prefill: bool


@dataclass
class InputBatch:
    """One step's batch, in batch order (input_batch.py:43-113; the fields steering can use).

    Tokens are flattened request by request: request i owns rows
    ``[query_start_loc_np[i], query_start_loc_np[i+1])``; rows ``num_tokens ..
    num_tokens_after_padding`` are padding (``is_padding``) with stale ids and positions.
    """

    req_ids: list[str]  # batch_idx -> req_id
    num_reqs: int
    num_reqs_after_padding: int
    idx_mapping: torch.Tensor  # batch_idx -> req_states slot
    idx_mapping_np: np.ndarray
    expanded_idx_mapping: torch.Tensor
    num_scheduled_tokens: np.ndarray  # [num_reqs]
    num_tokens: int
    num_tokens_after_padding: int
    num_draft_tokens: int
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    query_start_loc_np: np.ndarray
    seq_lens: torch.Tensor  # [num_reqs]
    num_computed_tokens_np: np.ndarray  # [num_reqs]
    prefill_len_np: np.ndarray
    num_computed_prefill_tokens_np: np.ndarray
    is_prefilling_np: np.ndarray
    has_prefill: bool
    input_ids: torch.Tensor  # [num_tokens_after_padding]
    positions: torch.Tensor  # [num_tokens_after_padding]: absolute position in the request
    is_padding: torch.Tensor  # [num_tokens_after_padding]
    logits_indices: torch.Tensor  # [num_reqs]: each request's last scheduled token
    cu_num_logits: torch.Tensor
    cu_num_logits_np: np.ndarray


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    logits: torch.Tensor  # [num_reqs, vocab] in the model dtype (stand-in addition)


@dataclass
class ExecuteModelState:
    input_batch: InputBatch
    hidden_states: torch.Tensor | None


def sort_batch_req_ids(num_tokens_per_req: dict[str, int], draft_tokens: dict[str, list[int]],
                       decode_query_len: int = 1) -> list[str]:
    """Batch order: decodes first, then prefills by length (model_runner.py:2507)."""
    return sorted(num_tokens_per_req,
                  key=lambda r: (not draft_tokens.get(r), num_tokens_per_req[r] != decode_query_len,
                                 num_tokens_per_req[r]))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# --------------------------------------------------------------------------------------------
# Model runner (V2) and worker
# --------------------------------------------------------------------------------------------


ModelFactory = Callable[[int, int], nn.Module]  # (tp_rank, pp_rank) -> model


class GPUModelRunner:
    """vLLM's V2 ``GPUModelRunner`` for one rank, on CPU, eager mode, greedy sampling.

    ``execute_model(scheduler_output)`` updates ``req_states``, calls ``self.prepare_inputs`` (an
    instance attribute wins, so it can be wrapped per instance as steerc does), builds the
    attention metadata and runs the model inside a forward context; ``sample_tokens()`` computes
    the logits at ``logits_indices`` and samples greedily (last PP rank only).
    """

    def __init__(self, vllm_config: VllmConfig, device: torch.device, model_factory: ModelFactory,
                 tp_rank: int = 0, pp_rank: int = 0):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.scheduler_config = vllm_config.scheduler_config
        self.parallel_config = vllm_config.parallel_config
        self.device = device
        self.model_factory = model_factory
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        self.is_first_pp_rank = pp_rank == 0
        self.is_last_pp_rank = pp_rank == self.parallel_config.pipeline_parallel_size - 1
        self.max_num_reqs = self.scheduler_config.max_num_seqs
        self.max_model_len = self.model_config.max_model_len
        self.max_num_tokens = self.scheduler_config.max_num_batched_tokens
        self.req_states = RequestState(self.max_num_reqs, self.max_model_len, self.max_num_tokens,
                                       self.model_config.hf_config.vocab_size)
        self.input_buffers = InputBuffers(self.max_num_reqs, _round_up(self.max_num_tokens, PAD_TOKENS_TO))
        self.model: nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.execute_model_state: ExecuteModelState | None = None

    # ---- model and KV cache ----------------------------------------------------------------

    def load_model(self, *args, **kwargs) -> None:
        self.model = self.model_factory(self.tp_rank, self.pp_rank)

    def get_model(self) -> nn.Module:
        return self.model

    def initialize_kv_cache(self) -> None:
        self.kv_caches = _bind_kv_cache(self.model, num_blocks=self.max_num_reqs, block_size=self.max_model_len)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A dummy forward of ``max_num_batched_tokens`` zero tokens at position 0, before the KV
        cache exists (attention is skipped), as vLLM's memory profiling does. Hooks see it."""
        n = self.max_num_tokens
        intermediate = None
        if not self.is_first_pp_rank:
            intermediate = self.model.make_empty_intermediate_tensors(n, self.model.dtype, self.device)
        ctx = ForwardContext(attn_metadata=None, slot_mapping=None, is_padding=torch.zeros(n, dtype=torch.bool),
                             batch_descriptor=BatchDescriptor(n))
        with set_forward_context(ctx):
            out = self.model(torch.zeros(n, dtype=torch.int32) if self.is_first_pp_rank else None,
                             torch.zeros(n, dtype=torch.int64), intermediate)
        if self.is_last_pp_rank:
            self.model.compute_logits(out[-1:])

    # ---- request bookkeeping ----------------------------------------------------------------

    def finish_requests(self, scheduler_output: SchedulerOutput) -> None:
        finished = set(scheduler_output.finished_req_ids) | set(scheduler_output.preempted_req_ids or ())
        for req_id in sorted(finished):
            self.req_states.remove_request(req_id)

    def add_requests(self, scheduler_output: SchedulerOutput) -> None:
        for new in scheduler_output.scheduled_new_reqs:
            self.req_states.remove_request(new.req_id)
            params = new.sampling_params
            self.req_states.add_request(
                req_id=new.req_id, prompt_len=new.prompt_len,
                all_token_ids=list(new.prefill_token_ids or new.prompt_token_ids),
                num_computed_tokens=new.num_computed_tokens, max_tokens=params.max_tokens,
                extra_args=params.extra_args,
            )

    def update_requests(self, scheduler_output: SchedulerOutput) -> None:
        reqs = scheduler_output.scheduled_cached_reqs
        for req_id, num_computed, new_ids in zip(reqs.req_ids, reqs.num_computed_tokens, reqs.new_token_ids):
            idx = self.req_states.req_id_to_index[req_id]
            self.req_states.num_computed_tokens_np[idx] = num_computed
            if new_ids:
                self.req_states.append_token_ids(idx, new_ids)
        np.minimum(self.req_states.num_computed_tokens_np, self.req_states.prefill_len.np,
                   out=self.req_states.num_computed_prefill_tokens)

    def gather_batch_req_state(self, scheduler_output: SchedulerOutput) -> BatchReqState:
        per_req = scheduler_output.num_scheduled_tokens
        req_ids = sort_batch_req_ids(per_req, scheduler_output.scheduled_spec_decode_tokens)
        idx_mapping_np = np.array([self.req_states.req_id_to_index[r] for r in req_ids], dtype=np.intp)
        prefill_len_np = self.req_states.prefill_len.np[idx_mapping_np]
        computed_prefill_np = self.req_states.num_computed_prefill_tokens[idx_mapping_np]
        is_prefilling_np = computed_prefill_np < prefill_len_np
        return BatchReqState(
            req_ids=req_ids, num_scheduled_tokens=np.array([per_req[r] for r in req_ids], dtype=np.int32),
            num_tokens=scheduler_output.total_num_scheduled_tokens, idx_mapping_np=idx_mapping_np,
            prefill_len_np=prefill_len_np, num_computed_prefill_tokens_np=computed_prefill_np,
            is_prefilling_np=is_prefilling_np, has_prefill=bool(is_prefilling_np.any()),
        )

    def prepare_inputs(self, scheduler_output: SchedulerOutput, batch_req_state: BatchReqState | None = None,
                       batch_desc: Any = None, num_active_loras: int = 0) -> InputBatch:
        """Flatten the scheduled tokens into the persistent buffers (model_runner.py:1388-1593)."""
        if batch_req_state is None:
            batch_req_state = self.gather_batch_req_state(scheduler_output)
        bs, buf, rs = batch_req_state, self.input_buffers, self.req_states
        num_tokens = bs.num_tokens
        num_tokens_after_padding = _round_up(num_tokens, PAD_TOKENS_TO)
        num_reqs = len(bs.req_ids)
        idx_mapping_np = bs.idx_mapping_np

        query_start_loc_np = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(bs.num_scheduled_tokens, out=query_start_loc_np[1:])
        buf.query_start_loc[: num_reqs + 1] = torch.from_numpy(query_start_loc_np)
        buf.query_start_loc[num_reqs + 1:] = num_tokens

        num_computed_tokens_np = rs.num_computed_tokens_np[idx_mapping_np]
        positions = np.concatenate([c + np.arange(n) for c, n in zip(num_computed_tokens_np, bs.num_scheduled_tokens)])
        slots = np.repeat(idx_mapping_np, bs.num_scheduled_tokens)
        buf.positions[:num_tokens] = torch.from_numpy(positions)
        buf.input_ids[:num_tokens] = torch.from_numpy(rs.all_token_ids.np[slots, positions])
        buf.is_padding[:num_tokens] = False
        buf.is_padding[num_tokens:num_tokens_after_padding] = True
        seq_lens_np = num_computed_tokens_np + bs.num_scheduled_tokens
        buf.seq_lens[:num_reqs] = torch.from_numpy(seq_lens_np)
        buf.seq_lens[num_reqs:] = 0

        idx_mapping = torch.from_numpy(idx_mapping_np.astype(np.int64))
        query_start_loc = buf.query_start_loc[: num_reqs + 1]
        return InputBatch(
            req_ids=bs.req_ids, num_reqs=num_reqs, num_reqs_after_padding=num_reqs,
            idx_mapping=idx_mapping, idx_mapping_np=idx_mapping_np, expanded_idx_mapping=idx_mapping,
            num_scheduled_tokens=bs.num_scheduled_tokens, num_tokens=num_tokens,
            num_tokens_after_padding=num_tokens_after_padding, num_draft_tokens=0,
            query_start_loc=query_start_loc, query_start_loc_np=query_start_loc_np,
            seq_lens=buf.seq_lens[:num_reqs], num_computed_tokens_np=num_computed_tokens_np,
            prefill_len_np=bs.prefill_len_np, num_computed_prefill_tokens_np=bs.num_computed_prefill_tokens_np,
            is_prefilling_np=bs.is_prefilling_np, has_prefill=bs.has_prefill,
            input_ids=buf.input_ids[:num_tokens_after_padding], positions=buf.positions[:num_tokens_after_padding],
            is_padding=buf.is_padding[:num_tokens_after_padding],
            logits_indices=(query_start_loc[1:] - 1).long(),
            cu_num_logits=torch.arange(num_reqs + 1, dtype=torch.int32),
            cu_num_logits_np=np.arange(num_reqs + 1, dtype=np.int32),
        )

    def prepare_attn(self, input_batch: InputBatch) -> AttentionMetadata:
        ib = input_batch
        slot_mapping = torch.full((ib.num_tokens_after_padding,), -1, dtype=torch.int64)
        slots = torch.repeat_interleave(ib.idx_mapping, torch.from_numpy(ib.num_scheduled_tokens).long())
        slot_mapping[: ib.num_tokens] = slots * self.max_model_len + ib.positions[: ib.num_tokens]
        return AttentionMetadata(
            num_actual_tokens=ib.num_tokens, num_reqs=ib.num_reqs, max_query_len=int(ib.num_scheduled_tokens.max()),
            query_start_loc=ib.query_start_loc.clone(), seq_lens=ib.seq_lens.clone(),
            block_table=ib.idx_mapping.clone(), slot_mapping=slot_mapping,
        )

    # ---- one step -----------------------------------------------------------------------------

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput,
                      intermediate_tensors: IntermediateTensors | None = None) -> IntermediateTensors | None:
        self.finish_requests(scheduler_output)
        self.add_requests(scheduler_output)
        self.update_requests(scheduler_output)
        self.execute_model_state = None
        if scheduler_output.total_num_scheduled_tokens == 0:
            return None

        batch_req_state = self.gather_batch_req_state(scheduler_output)
        input_batch = self.prepare_inputs(scheduler_output, batch_req_state, None, 0)
        md = self.prepare_attn(input_batch)
        n = input_batch.num_tokens_after_padding
        model_inputs = {"input_ids": input_batch.input_ids, "positions": input_batch.positions,
                        "inputs_embeds": None, "intermediate_tensors": None}
        if not self.is_first_pp_rank:
            assert intermediate_tensors is not None
            model_inputs["input_ids"] = None
            model_inputs["intermediate_tensors"] = intermediate_tensors[:n]
        ctx = ForwardContext(
            attn_metadata=_attn_metadata(self.model, md),
            slot_mapping={a.layer_name: md.slot_mapping for a in attention_layers(self.model)},
            is_padding=input_batch.is_padding, batch_descriptor=BatchDescriptor(n),
        )
        with set_forward_context(ctx):
            model_output = self.model(**model_inputs)
        if not self.is_last_pp_rank:
            self.execute_model_state = ExecuteModelState(input_batch, None)
            return model_output
        self.execute_model_state = ExecuteModelState(input_batch, model_output)
        return None

    @torch.inference_mode()
    def sample_tokens(self, grammar_output: Any = None) -> ModelRunnerOutput | None:
        state, self.execute_model_state = self.execute_model_state, None
        if state is None or not self.is_last_pp_rank:
            return None
        ib = state.input_batch
        logits = self.model.compute_logits(state.hidden_states[ib.logits_indices])
        sampled = logits.argmax(dim=-1).tolist()
        return ModelRunnerOutput(
            req_ids=list(ib.req_ids), req_id_to_index=dict(self.req_states.req_id_to_index),
            sampled_token_ids=[[t] for t in sampled], logits=logits,
        )


class Worker:
    """vLLM's GPU ``Worker`` (v1/worker/gpu_worker.py) for one rank, on CPU.

    ``rank = pp_rank * tp_size + tp_rank`` as in vLLM; ``tp_rank``/``pp_rank`` are stand-in
    conveniences (vLLM code asks ``get_tensor_model_parallel_rank()``, which works here too
    inside :func:`worker_scope`). Like vLLM's, ``__init__`` does not call ``super().__init__()``,
    so a mixed-in extension's ``__init__`` never runs.
    """

    def __init__(self, vllm_config: VllmConfig, model_factory: ModelFactory, rank: int = 0,
                 local_rank: int | None = None, tp_group: TensorParallelGroup | None = None,
                 is_driver_worker: bool | None = None):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.scheduler_config = vllm_config.scheduler_config
        self.parallel_config = vllm_config.parallel_config
        self.rank = rank
        self.local_rank = rank if local_rank is None else local_rank
        self.is_driver_worker = rank == 0 if is_driver_worker is None else is_driver_worker
        tp = self.parallel_config.tensor_parallel_size
        self.tp_rank, self.pp_rank = rank % tp, rank // tp
        self.tp_group = tp_group
        self.model_factory = model_factory
        self.device: torch.device | None = None
        self.model_runner: GPUModelRunner | None = None

    def init_device(self) -> None:
        self.device = torch.device("cpu")
        self.model_runner = GPUModelRunner(self.vllm_config, self.device, self.model_factory,
                                           tp_rank=self.tp_rank, pp_rank=self.pp_rank)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        self.model_runner.load_model(load_dummy_weights=load_dummy_weights)

    def get_model(self) -> nn.Module:
        return self.model_runner.get_model()

    def apply_model(self, fn: Callable[[nn.Module], Any]) -> Any:
        return fn(self.get_model())

    def determine_available_memory(self) -> int:
        self.model_runner.profile_run()
        return 1 << 30

    def initialize_from_config(self, kv_cache_config: Any = None) -> None:
        self.model_runner.initialize_kv_cache()

    def compile_or_warm_up_model(self) -> None:
        """Eager mode: nothing to compile or capture."""

    def execute_model(self, scheduler_output: SchedulerOutput,
                      intermediate_tensors: IntermediateTensors | None = None) -> IntermediateTensors | None:
        return self.model_runner.execute_model(scheduler_output, intermediate_tensors)

    def sample_tokens(self, grammar_output: Any = None) -> ModelRunnerOutput | None:
        return self.model_runner.sample_tokens(grammar_output)

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


# --------------------------------------------------------------------------------------------
# Worker extension and collective_rpc (v1/worker/worker_base.py, v1/serial_utils.py)
# --------------------------------------------------------------------------------------------


def resolve_obj_by_qualname(qualname: str) -> Any:
    module_name, obj_name = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), obj_name)


def extend_worker_class(extension_cls: type | str | None, worker_cls: type[Worker] = Worker) -> type[Worker]:
    """vLLM's ``WorkerWrapperBase.init_worker`` mix-in (worker_base.py:308-336).

    Every non-dunder attribute of the extension must be absent from the worker class (vLLM
    asserts, so this raises ``AssertionError``); the extension is then appended as the LAST
    base. vLLM mutates the Worker class itself; here a fresh subclass is extended, so tests
    with different extensions do not leak into each other.
    """
    cls = type("Worker", (worker_cls,), {"__module__": __name__})
    if extension_cls is None:
        return cls
    if isinstance(extension_cls, str):
        extension_cls = resolve_obj_by_qualname(extension_cls)
    for attr in dir(extension_cls):
        if attr.startswith("__"):
            continue
        if hasattr(cls, attr):
            raise AssertionError(
                f"Worker class {cls} already has an attribute {attr}, which conflicts with the worker"
                f" extension class {extension_cls}.")
    cls.__bases__ = cls.__bases__ + (extension_cls,)
    cls._worker_extension_cls = extension_cls
    return cls


def make_worker(extension_cls: type | str | None = None, *, vllm_config: VllmConfig, model_factory: ModelFactory,
                rank: int = 0, tp_group: TensorParallelGroup | None = None,
                worker_cls: type[Worker] | None = None) -> Worker:
    """Build one worker through vLLM's start-up order:
    ``init_device()`` -> ``init_worker_extension()`` (if the extension has it) -> ``load_model()``.

    ``load_model`` is looked up on the instance, so an extension may replace it in
    ``init_worker_extension`` (the way to act right after the weights load).
    """
    cls = worker_cls or extend_worker_class(extension_cls)
    worker = cls(vllm_config=vllm_config, model_factory=model_factory, rank=rank, tp_group=tp_group)
    ext = getattr(cls, "_worker_extension_cls", None)
    with worker_scope(worker):
        worker.init_device()
        hook = getattr(ext, "init_worker_extension", None)
        if callable(hook):
            hook(worker)
        worker.load_model()
    return worker


def make_workers(hf_model, *, tp_size: int = 1, pp_size: int = 1, extension_cls: type | str | None = None,
                 additional_config: dict | None = None, max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
                 max_model_len: int | None = None, profile: bool = True) -> list[Worker]:
    """All ``tp_size * pp_size`` workers of an engine for an HF llama, started as vLLM starts them.

    After :func:`make_worker` for every rank: a profile run (a dummy forward, hooks included) on
    every rank, then KV-cache allocation. Workers are returned in rank order.
    """
    cfg = hf_model.config
    ext_name = extension_cls if isinstance(extension_cls, str) else (
        f"{extension_cls.__module__}.{extension_cls.__qualname__}" if extension_cls else "")
    vllm_config = VllmConfig(
        model_config=ModelConfig(hf_config=cfg, dtype=next(hf_model.parameters()).dtype,
                                 max_model_len=max_model_len or cfg.max_position_embeddings),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs),
        parallel_config=ParallelConfig(tp_size, pp_size, worker_extension_cls=ext_name),
        additional_config=dict(additional_config or {}),
    )
    pipeline = PipelineGroup(pp_size, tp_size)

    def factory_for(group: TensorParallelGroup) -> ModelFactory:
        return lambda tp_rank, pp_rank: from_hf(hf_model, tp_size, tp_rank, pp_size, pp_rank, tp_group=group)

    cls = extend_worker_class(extension_cls)  # one class for all ranks, as in a vLLM process
    workers = [make_worker(vllm_config=vllm_config, model_factory=factory_for(pipeline.tp_groups[r // tp_size]),
                           rank=r, tp_group=pipeline.tp_groups[r // tp_size], worker_cls=cls)
               for r in range(tp_size * pp_size)]
    if profile:
        pipeline_run(workers, lambda w, _x: w.determine_available_memory(), stage_inputs=False)
    for w in workers:
        with worker_scope(w):
            w.initialize_from_config(None)
            w.compile_or_warm_up_model()
    return workers


def pipeline_run(workers: Sequence[Worker], fn: Callable[[Worker, Any], Any], stage_inputs: bool = True) -> list[Any]:
    """Run ``fn(worker, intermediate)`` on every rank: TP ranks in lockstep, PP stages in order.

    With ``stage_inputs`` each stage gets the previous stage's output; otherwise stages run
    independently (``intermediate=None``). Returns the last stage's results in TP-rank order.
    """
    pc = workers[0].parallel_config
    tp, pp = pc.tensor_parallel_size, pc.pipeline_parallel_size
    grid = [[workers[p * tp + t] for t in range(tp)] for p in range(pp)]
    groups = [grid[p][0].tp_group or TensorParallelGroup(1) for p in range(pp)]

    def scoped(w: Worker, x: Any) -> Callable[[], Any]:
        def call():
            with worker_scope(w):
                return fn(w, x)
        return call

    intermediate, outputs = None, []
    for p in range(pp):
        outputs = groups[p].run([scoped(w, intermediate if stage_inputs else None) for w in grid[p]])
        intermediate = outputs[0]
    return outputs


def _msgpack_round_trip(obj: Any, what: str) -> Any:
    try:
        return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), raw=False, strict_map_key=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"collective_rpc {what} must be msgpack-native (None, bool, int, float, str, bytes, list, tuple, dict): "
            f"{exc}. vLLM sends them LLM -> engine core with msgpack; tensors arrive as plain lists and "
            f"other objects need VLLM_ALLOW_INSECURE_SERIALIZATION=1.") from exc


def collective_rpc(workers: Sequence[Worker], method: str, args: tuple = (), kwargs: dict | None = None,
                   timeout: float | None = None) -> list[Any]:
    """``LLM.collective_rpc``: call ``method`` by name on every worker, results in rank order.

    Arguments and results take the msgpack hop vLLM takes between the LLM process and the engine
    core (tuples come back as lists, bytes stay bytes). Anything that is not msgpack-native
    raises ``TypeError`` — stricter than vLLM for tensors, which it would silently turn into lists.
    """
    if not isinstance(method, str):
        raise TypeError(f"Object of type {type(method)} is not serializable. Set VLLM_ALLOW_INSECURE_SERIALIZATION=1 "
                        "to allow fallback to pickle-based serialization.")
    args, kwargs = _msgpack_round_trip([list(args), dict(kwargs or {})], "arguments")
    results = []
    for w in workers:
        with worker_scope(w):
            results.append(getattr(w, method)(*args, **kwargs))
    return _msgpack_round_trip(results, "results")


# --------------------------------------------------------------------------------------------
# Engine: scheduler + executor + greedy sampler
# --------------------------------------------------------------------------------------------


@dataclass
class RequestRecord:
    req_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    extra_args: dict[str, Any] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # one [vocab] row per generated token
    slot: int | None = None  # req_states index it ran in
    num_computed_tokens: int = 0
    num_tokens_sent: int = 0  # tokens already handed to the workers
    finished: bool = False

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


class StandinEngine:
    """Continuous batching over a list of workers (one engine core with its executor).

    Each :meth:`step` schedules every running request (decode: one token; prefill: the rest of
    the prompt, at most ``chunk`` tokens per step with chunked prefill) and admits waiting
    requests while slots (``max_num_seqs``) and the token budget (``max_num_batched_tokens``)
    allow, then runs all ranks and samples greedily. A request finishes after ``max_tokens``
    tokens; its slot is freed at the start of the next step (``finished_req_ids``, as in vLLM)
    and reused. Partial-prefill samples are discarded.
    """

    def __init__(self, workers: Sequence[Worker], chunk: int | None = None):
        self.workers = list(workers)
        self.chunk = chunk
        cfg = self.workers[0].vllm_config
        self.max_num_seqs = cfg.scheduler_config.max_num_seqs
        self.max_num_batched_tokens = cfg.scheduler_config.max_num_batched_tokens
        self.max_model_len = cfg.model_config.max_model_len
        tp = cfg.parallel_config.tensor_parallel_size
        self.last_stage = self.workers[len(self.workers) - tp:]
        for w in self.workers:
            if not w.model_runner.kv_caches:
                with worker_scope(w):
                    w.initialize_from_config(None)
        self.requests: dict[str, RequestRecord] = {}
        self.waiting: list[RequestRecord] = []
        self.running: list[RequestRecord] = []
        self._finished_since_last_step: set[str] = set()
        self.num_steps = 0

    def add_request(self, req_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                    extra_args: dict[str, Any] | None = None) -> None:
        if req_id in self.requests:
            raise ValueError(f"duplicate request id {req_id!r}")
        if not prompt_token_ids or max_tokens < 1:
            raise ValueError("need a non-empty prompt and max_tokens >= 1")
        if len(prompt_token_ids) + max_tokens > self.max_model_len:
            raise ValueError(f"{req_id!r}: prompt + max_tokens exceeds max_model_len={self.max_model_len}")
        if self.chunk is None and len(prompt_token_ids) > self.max_num_batched_tokens:
            raise ValueError(f"{req_id!r}: prompt longer than max_num_batched_tokens and chunked prefill is off")
        rec = RequestRecord(req_id, [int(t) for t in prompt_token_ids], max_tokens, extra_args)
        self.requests[req_id] = rec
        self.waiting.append(rec)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self._finished_since_last_step)

    def _num_new_tokens(self, n: int, budget: int) -> int:
        if self.chunk is not None:
            return min(n, self.chunk, budget)
        return n if n <= budget else 0

    def schedule(self) -> SchedulerOutput | None:
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        cached, new_reqs = CachedRequestData(), []
        for rec in self.running:
            n = self._num_new_tokens(len(rec.all_token_ids) - rec.num_computed_tokens, budget)
            if n == 0:
                continue
            num_scheduled[rec.req_id] = n
            budget -= n
            cached.req_ids.append(rec.req_id)
            cached.num_computed_tokens.append(rec.num_computed_tokens)
            cached.new_token_ids.append(rec.all_token_ids[rec.num_tokens_sent:])
            rec.num_tokens_sent = len(rec.all_token_ids)
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            rec = self.waiting[0]
            n = self._num_new_tokens(len(rec.prompt_token_ids), budget)
            if n == 0:
                break
            self.waiting.pop(0)
            self.running.append(rec)
            num_scheduled[rec.req_id] = n
            budget -= n
            new_reqs.append(NewRequestData(rec.req_id, list(rec.prompt_token_ids),
                                           SamplingParams(rec.max_tokens, rec.extra_args),
                                           prefill_token_ids=list(rec.prompt_token_ids)))
            rec.num_tokens_sent = len(rec.prompt_token_ids)
        finished, self._finished_since_last_step = self._finished_since_last_step, set()
        if not num_scheduled and not finished:
            return None
        return SchedulerOutput(new_reqs, cached, num_scheduled, sum(num_scheduled.values()), finished)

    def step(self) -> list[str]:
        """One engine step; returns the ids of the requests that finished in it."""
        scheduler_output = self.schedule()
        if scheduler_output is None:
            return []
        self.num_steps += 1
        pipeline_run(self.workers, lambda w, x: w.execute_model(scheduler_output, x))
        if scheduler_output.total_num_scheduled_tokens == 0:
            return []
        outputs = []
        for w in self.last_stage:
            with worker_scope(w):
                outputs.append(w.sample_tokens(None))
        out = outputs[0]
        done = []
        for i, req_id in enumerate(out.req_ids):
            rec = self.requests[req_id]
            rec.num_computed_tokens += scheduler_output.num_scheduled_tokens[req_id]
            rec.slot = out.req_id_to_index[req_id]
            if rec.num_computed_tokens < len(rec.all_token_ids):
                continue  # partial prefill: the sample is discarded
            rec.output_token_ids.append(out.sampled_token_ids[i][0])
            rec.logits.append(out.logits[i].clone())
            if len(rec.output_token_ids) >= rec.max_tokens:
                rec.finished = True
                self.running.remove(rec)
                self._finished_since_last_step.add(req_id)
                done.append(req_id)
        return done

    def run(self) -> dict[str, RequestRecord]:
        """Step until every request has finished and its slot has been freed on the workers."""
        while self.has_unfinished_requests():
            self.step()
        return self.requests


# --------------------------------------------------------------------------------------------
# Optional: a fake ``vllm`` package for code that imports vLLM names
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def fake_vllm_modules() -> Iterator[types.ModuleType]:
    """Temporarily install ``vllm``, ``vllm.forward_context``, ``vllm.distributed``,
    ``vllm.sequence`` and ``vllm.model_executor.models.utils`` backed by this stand-in, for code
    under test that does ``from vllm.forward_context import get_forward_context`` and the like.
    """
    this = sys.modules[__name__]
    contents = {
        "vllm": {"__version__": VLLM_VERSION},
        "vllm.forward_context": ["ForwardContext", "get_forward_context", "is_forward_context_available",
                                 "set_forward_context"],
        "vllm.distributed": ["get_tp_group", "get_pp_group", "get_tensor_model_parallel_rank",
                             "get_tensor_model_parallel_world_size", "get_pipeline_model_parallel_rank"],
        "vllm.sequence": ["IntermediateTensors"],
        "vllm.model_executor": [],
        "vllm.model_executor.models": [],
        "vllm.model_executor.models.utils": ["PPMissingLayer", "make_layers"],
        "vllm.model_executor.layers": [],
        "vllm.model_executor.layers.linear": ["ColumnParallelLinear", "MergedColumnParallelLinear",
                                              "QKVParallelLinear", "RowParallelLinear"],
        "vllm.model_executor.layers.layernorm": ["RMSNorm"],
    }
    saved = {name: sys.modules.get(name) for name in contents}
    try:
        for name, attrs in contents.items():
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs if isinstance(attrs, dict) else {a: getattr(this, a) for a in attrs})
            sys.modules[name] = mod
            if "." in name:
                parent, child = name.rsplit(".", 1)
                setattr(sys.modules[parent], child, mod)
        yield sys.modules["vllm"]
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
