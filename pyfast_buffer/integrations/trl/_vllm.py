"""The default ``complete``: one completion from a vLLM server's ``/v1/completions``, asked the way TRL 1.16's own
worker asks (token ids in, ``return_token_ids``, the sampled token's logprob, a fresh seed per request), with
TRL's ``VLLMClient`` waiting for the server first. Needs aiohttp (``pip install "trl[vllm]"``); imported only when
a worker is built without its own ``complete``.
"""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional, Tuple


class VLLMComplete:
    """``await complete(prompt_ids, max_tokens) -> (ids, logprobs)`` against ``server_url``."""

    def __init__(
        self,
        server_url: str = "http://localhost:8000",
        model: Optional[str] = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: Optional[float] = None,
        repetition_penalty: float = 1.0,
        request_timeout: float = 120.0,
        server_timeout: float = 240.0,
    ) -> None:
        try:
            import aiohttp  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "StalenessRolloutWorker's default complete talks to a vLLM server over HTTP and needs aiohttp: "
                'pip install "trl[vllm]" (or pass complete=your_async_function)'
            ) from exc
        self.server_url = server_url.rstrip("/")
        self.model = model
        self.fields: Dict[str, Any] = dict(
            temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=repetition_penalty
        )
        if min_p is not None:
            self.fields["min_p"] = min_p
        self.request_timeout = request_timeout
        self.server_timeout = server_timeout
        self._ready = False
        self._session: Any = None

    def _wait_for_server(self) -> None:
        from trl.experimental.async_grpo.vllm_client import VLLMClient

        VLLMClient(self.server_url, self.server_timeout).wait_for_server_ready()
        self._ready = True

    async def __call__(self, prompt_ids: List[int], max_tokens: int) -> Tuple[List[int], List[float]]:
        import asyncio

        import aiohttp

        if not self._ready:
            await asyncio.to_thread(self._wait_for_server)
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        payload: Dict[str, Any] = {
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "n": 1,
            "return_token_ids": True,
            "logprobs": 0,
            "seed": random.getrandbits(63),
            **self.fields,
        }
        if self.model is not None:
            payload["model"] = self.model
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self._session.post(f"{self.server_url}/v1/completions", json=payload, timeout=timeout) as response:
            response.raise_for_status()
            body = await response.json()
        choice = body["choices"][0]
        return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"])


def vllm_complete(server_url: str = "http://localhost:8000", **fields: Any) -> VLLMComplete:
    """The default ``complete`` of ``StalenessRolloutWorker`` (``fields``: VLLMComplete's sampling arguments)."""
    return VLLMComplete(server_url, **fields)
