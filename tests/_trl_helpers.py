"""TRL 1.16's real AsyncGRPOTrainer on the tiny in-code policy, driven by our worker, for the TRL tests.

Only the two CPU replacements of ``pyfast_buffer.integrations.trl.cpu.use_cpu_kernels`` are installed; the trainer,
its planner, collator, tree packing, loss, callbacks, weight-sync bookkeeping, staleness filter and checkpoints are
TRL's own. Generation is ``CpuGenerator`` (a copy of the policy that receives the trainer's weights), slowed by a
seeded uneven latency so that groups really go stale.
"""

from __future__ import annotations

import os
import random
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

G = 4  # completions per prompt
PER_DEVICE = 8  # samples per micro-batch: two groups


def uneven(low: float = 0.0, high: float = 0.06, slow_share: float = 0.15, slow: float = 0.35) -> Callable:
    """A latency model: mostly ``uniform(low, high)`` seconds, sometimes ``slow`` (a straggler)."""

    def draw(rng: random.Random) -> float:
        return slow if rng.random() < slow_share else rng.uniform(low, high)

    return draw


class Run:
    """One trainer + worker over a shared model folder; ``train()`` returns TRL's log history."""

    def __init__(
        self,
        folder: str,
        strategy: str,
        max_age: int,
        steps: int,
        *,
        prompts: int = 48,
        save_steps: Optional[int] = None,
        token_budget: Optional[int] = 0,
        max_staleness: Optional[int] = None,
        accumulation: int = 1,
        per_device: int = PER_DEVICE,
        max_model_len: Optional[int] = None,
        weight_sync_steps: int = 1,
        complete: Optional[Callable] = None,
        latency: Optional[Callable] = None,
        seed: int = 0,
        worker_kwargs: Optional[Dict[str, Any]] = None,
        model: Optional[Tuple[str, Any]] = None,
    ) -> None:
        from pyfast_buffer.integrations.trl import StalenessRolloutWorker
        from pyfast_buffer.integrations.trl.cpu import CpuGenerator, use_cpu_kernels
        from pyfast_buffer.integrations.trl.tiny import sum_dataset, sum_reward, tiny_policy

        self.undo = use_cpu_kernels()
        from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

        self.path, self.tokenizer = model or tiny_policy(os.path.join(folder, "model"))
        self.dataset = sum_dataset(prompts, seed=seed)
        self.generator = CpuGenerator(self.path, latency=latency or uneven(), seed=seed)
        self.worker = StalenessRolloutWorker(
            dataset=self.dataset,
            processing_class=self.tokenizer,
            reward_funcs=[sum_reward],
            num_generations=G,
            max_completion_length=4,
            strategy=strategy,
            max_age=max_age,
            complete=complete or self.generator.complete,
            **(worker_kwargs or {}),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' own deprecation notices about its arguments
            self.config = self._config(
                AsyncGRPOConfig, folder, steps, save_steps, token_budget, max_staleness, max_age, seed
            )
            self.config.gradient_accumulation_steps = accumulation
            self.config.per_device_train_batch_size = per_device
            self.config.weight_sync_steps = weight_sync_steps
        self.delivered: List[int] = []  # group ids in the order the trainer pulled their samples
        self.reserved: Dict[int, int] = {}  # group id -> dataset index, as the worker reserved them
        self._watch()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' and TRL's own deprecation notices
            self.trainer = AsyncGRPOTrainer(
                model=self.path,
                args=self.config,
                train_dataset=self.dataset,
                processing_class=self.tokenizer,
                reward_funcs=[sum_reward],
                rollout_worker=self.worker,
                weight_transfer=self.generator.weight_transfer,
                callbacks=self.worker.callbacks,
            )
        if max_model_len is not None:
            # A stand-in for the vLLM server TRL asks at train start when token_budget is None (its default): it
            # reports max_model_len, which TRL then batches by.
            client = self.trainer.vllm_client
            client.wait_for_server_ready = lambda *a, **k: None
            client.get_max_model_len = lambda: max_model_len

    @staticmethod
    def _config(cls, folder, steps, save_steps, token_budget, max_staleness, max_age, seed):
        return cls(
            output_dir=os.path.join(folder, "out"),
            per_device_train_batch_size=PER_DEVICE,
            num_generations=G,
            max_completion_length=4,
            token_budget=token_budget,
            max_steps=steps,
            logging_steps=1,
            save_steps=save_steps or steps + 1,
            save_strategy="steps" if save_steps else "no",
            report_to="none",
            use_cpu=True,
            learning_rate=0.05,
            max_staleness=max_age if max_staleness is None else max_staleness,
            dtype="float32",
            seed=seed,
            disable_tqdm=True,
            heartbeat_stale_after_s=60.0,
        )

    def _watch(self) -> None:
        queue = self.worker.rollout_buffer
        get = queue.get

        def counted_get(*args: Any, **kwargs: Any) -> Any:
            sample = get(*args, **kwargs)
            if not self.delivered or self.delivered[-1] != sample.group_id:
                self.delivered.append(sample.group_id)
            return sample

        queue.get = counted_get  # type: ignore[method-assign]
        from pyfast_buffer.integrations.trl import _generation

        reserve = _generation._reserve
        worker = self.worker

        def recorded(w: Any) -> int:
            group = reserve(w)
            if w is worker:
                self.reserved[group] = w._groups[group]["index"]
            return group

        _generation._reserve = recorded  # undone in close()
        self._restore_reserve = lambda: setattr(_generation, "_reserve", reserve)

    def train(self, **kwargs: Any) -> List[Dict[str, Any]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.trainer.train(**kwargs)
        return self.trainer.state.log_history

    def close(self) -> None:
        self.worker.stop(2.0)
        self._restore_reserve()
        self.undo()


def trainer_args(**overrides: Any) -> Any:
    """The fields of ``AsyncGRPOConfig`` the worker reads, without building a trainer (``worker.configure``)."""
    from types import SimpleNamespace

    fields = dict(
        max_staleness=4,
        num_generations=G,
        per_device_train_batch_size=PER_DEVICE,
        world_size=1,
        gradient_accumulation_steps=1,
        weight_sync_steps=1,
        token_budget=0,
        queue_maxsize=0,
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def idle_worker(model: Tuple[str, Any], prompts: int = 4, **kwargs: Any) -> Any:
    """A worker over the tiny policy whose ``complete`` never answers (for what needs no generation)."""
    from pyfast_buffer.integrations.trl import StalenessRolloutWorker
    from pyfast_buffer.integrations.trl.tiny import sum_dataset, sum_reward

    options = dict(num_generations=G, max_completion_length=4, complete=never, max_age=1)
    options.update(kwargs)
    return StalenessRolloutWorker(
        dataset=sum_dataset(prompts), processing_class=model[1], reward_funcs=[sum_reward], **options
    )


async def never(prompt_ids: List[int], max_tokens: int) -> Tuple[List[int], List[float]]:
    """A ``complete`` that never answers."""
    import asyncio

    await asyncio.sleep(3600)
    return [], []


def balanced(ledger: Dict[str, int]) -> bool:
    """docs/design.md, "The ledger": every trajectory put is in exactly one place."""
    return ledger["sampled_total"] == ledger["put_total"] and ledger["put_total"] == (
        ledger["retired"] + ledger["dropped_stale"] + ledger["evicted"] + ledger["buffer_left"]
    )


def trl_drops(history: List[Dict[str, Any]]) -> float:
    return sum(h.get("sample/dropped_stale_total", 0.0) or 0.0 for h in history)


def trl_oversize_drops(history: List[Dict[str, Any]]) -> float:
    """Samples TRL's token-budget batcher dropped for being longer than the budget."""
    return sum(h.get("batch/dropped_oversize_total", 0.0) or 0.0 for h in history)


def trl_staleness_max(history: List[Dict[str, Any]]) -> float:
    return max((h["sample/staleness_max"] for h in history if h.get("sample/staleness_max") is not None), default=0)
