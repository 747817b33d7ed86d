"""Running TRL's ``AsyncGRPOTrainer`` on a CPU: the two replacements it needs, and an in-process generator.

TRL 1.16's trainer needs a GPU in exactly two places, and :func:`use_cpu_kernels` replaces those two and nothing
else:

- its tree-packed attention (``trl.experimental.async_grpo.packing``) calls a FlashAttention-3 varlen kernel fetched
  from the hub; :func:`varlen_attention` computes the same thing with plain torch (one masked softmax per segment);
- ``get_peak_flops_per_device`` asks ``torch.cuda`` for the device name; on a CPU there is none, so the trainer is
  told the peak is unknown (it then skips its MFU metrics, as it does for any unknown device).

:class:`CpuGenerator` is a copy of the policy that generates completions in process: its ``complete`` is the
worker's generation seam and its ``weight_transfer`` the trainer's weight-sync seam (``WeightTransferProtocol``),
which copies the trainer's parameters into the copy, so generation really lags training by the weights it last
received. For tests, examples and CPU users; a real run generates with vLLM (``vllm_complete``).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from typing import Any, Callable, Iterator, List, Optional, Tuple


def varlen_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float] = None,
    causal: bool = True,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    **unused: Any,
) -> Any:
    """FlashAttention's ``flash_attn_varlen_func`` in plain torch: ``q`` is ``(total_q, heads, dim)``, ``k``/``v``
    ``(total_k, kv_heads, dim)``, segment ``i`` attends rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]`` of ``q`` to rows
    ``cu_seqlens_k[i]:cu_seqlens_k[i+1]`` of ``k``; the causal mask is aligned to the bottom right, as FlashAttention
    aligns it when a segment has more keys than queries."""
    import torch

    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(dim)
    out = torch.empty_like(q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    left, right = window_size
    for i in range(len(cq) - 1):
        qi = q[cq[i] : cq[i + 1]].transpose(0, 1).float()  # (heads, lq, dim)
        ki = k[ck[i] : ck[i + 1]].transpose(0, 1).float()
        vi = v[ck[i] : ck[i + 1]].transpose(0, 1).float()
        if kv_heads != heads:  # grouped-query attention: each kv head serves heads // kv_heads query heads
            ki = ki.repeat_interleave(heads // kv_heads, dim=0)
            vi = vi.repeat_interleave(heads // kv_heads, dim=0)
        scores = torch.matmul(qi, ki.transpose(-1, -2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        lq, lk = qi.shape[1], ki.shape[1]
        rows = torch.arange(lq).unsqueeze(1) + (lk - lq)  # the key position each query sits at
        cols = torch.arange(lk).unsqueeze(0)
        allowed = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            allowed &= cols <= rows
        if left >= 0:
            allowed &= cols >= rows - left
        if right >= 0 and not causal:
            allowed &= cols <= rows + right
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[cq[i] : cq[i + 1]] = torch.matmul(torch.softmax(scores, dim=-1), vi).transpose(0, 1).to(q.dtype)
    return out


class _VarlenKernel:
    """What ``packing._flash_attn()`` returns: an object with ``flash_attn_varlen_func``."""

    flash_attn_varlen_func = staticmethod(varlen_attention)


def _no_peak_flops(accelerator: Any, dtype: str) -> None:
    return None


def use_cpu_kernels() -> Callable[[], None]:
    """Installs the two CPU replacements into TRL (see the module docstring); returns a function that undoes them.

    Call it before constructing ``AsyncGRPOTrainer``. It changes nothing else in TRL."""
    import trl.experimental.async_grpo.async_grpo_trainer as trainer_module
    import trl.experimental.async_grpo.packing as packing

    saved = (getattr(packing, "_flash_attn"), getattr(trainer_module, "get_peak_flops_per_device"))  # noqa: B009
    # setattr: the replacements are not the originals' types (an lru_cache wrapper), only their call shapes
    setattr(packing, "_flash_attn", lambda: _VarlenKernel)  # noqa: B010
    setattr(trainer_module, "get_peak_flops_per_device", _no_peak_flops)  # noqa: B010

    def undo() -> None:
        setattr(packing, "_flash_attn", saved[0])  # noqa: B010
        setattr(trainer_module, "get_peak_flops_per_device", saved[1])  # noqa: B010

    return undo


class CpuGenerator:
    """An in-process copy of the policy that samples completions (``complete``) and receives the trainer's weights
    (``weight_transfer``). ``latency`` (seconds, drawn per completion) is slept before each answer, so that a test
    or a benchmark can make generation slow and uneven and staleness really occurs.

    Args:
        model_path: the folder the trainer loads its model from (``AsyncGRPOTrainer(model=model_path)``).
        temperature: sampling temperature of the generator.
        latency: a function returning the seconds one completion takes beyond the model's own compute, or None.
        seed: seeds the sampling and the latency draws.
    """

    def __init__(
        self,
        model_path: str,
        temperature: float = 1.0,
        latency: Optional[Callable[[random.Random], float]] = None,
        seed: int = 0,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self._model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="eager")
        self._model.eval()
        self._torch = torch
        self._lock = threading.Lock()  # one generation or one weight load at a time
        self._generator = torch.Generator().manual_seed(seed)
        self._random = random.Random(seed)
        self.temperature = temperature
        self.latency = latency
        eos = self._model.generation_config.eos_token_id
        self._eos = set([eos] if isinstance(eos, int) else list(eos or []))
        self.weights_received = 0
        self.weight_transfer = _CopyWeights(self)

    def _sample(self, prompt_ids: List[int], max_tokens: int) -> Tuple[List[int], List[float]]:
        torch = self._torch
        with self._lock, torch.no_grad():
            ids = list(prompt_ids)
            out: List[int] = []
            logps: List[float] = []
            for _ in range(max_tokens):  # the whole sequence each token: no cache API to track across versions
                logits = self._model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                logprobs = torch.log_softmax(logits / max(self.temperature, 1e-6), dim=-1)
                token = int(torch.multinomial(logprobs.exp(), 1, generator=self._generator))
                out.append(token)
                logps.append(float(logprobs[token]))
                ids.append(token)
                if token in self._eos:
                    break
            return out, logps

    async def complete(self, prompt_ids: List[int], max_tokens: int) -> Tuple[List[int], List[float]]:
        """The worker's generation seam: completion token ids and their log-probabilities under the weights last
        received."""
        if self.latency is not None:
            await asyncio.sleep(self.latency(self._random))
        return await asyncio.to_thread(self._sample, list(prompt_ids), max_tokens)

    def _load(self, named: Iterator[Tuple[str, Any]]) -> None:
        params = dict(self._model.named_parameters())
        missing = []
        with self._lock, self._torch.no_grad():
            for name, tensor in named:
                target = params.get(name)
                if target is None or target.shape != tensor.shape:
                    missing.append(name)
                    continue
                target.copy_(tensor.detach().to(target.device, target.dtype))
        if missing:
            raise ValueError(f"CpuGenerator: the trainer sent weights the generator does not have: {missing[:5]}")
        self.weights_received += 1


class _CopyWeights:
    """TRL's ``WeightTransferProtocol`` for :class:`CpuGenerator`: ``send_weights`` copies the stream in."""

    def __init__(self, generator: CpuGenerator) -> None:
        self._generator = generator

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator: Iterator[Tuple[str, Any]]) -> None:
        self._generator._load(iterator)

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass
