"""verl's own keys for the sampler, read from the trainer that verl's ``refill_fn`` is bound to.

verl builds a custom sampler with ``refill_fn=self._add_prompts_to_generate``, a bound method of its trainer,
whose ``config`` is the whole composed Hydra config. The settings verl passes to its own buffer only
(``algorithm.filter_groups``, ``trainer.v1.sampler.sync_refill_failed_groups``, ``data.train_batch_size`` and
``data.gen_batch_size``) are read from there, so they are set once, the verl way, and verl's dataloader (which
forces ``data.gen_batch_size`` to 1 only when *its* keys ask for exact refills) agrees with the sampler.

No verl import: the config is read through ``get`` or attributes. Absolute imports only (see ``__init__``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from pyfast_buffer.verl_mapping import read

#: The key that names verl's agent-loop manager class (a fully qualified class name; verl's ``main_ppo.py``).
MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
#: The fully qualified name of our manager, as it goes under MANAGER_KEY.
MANAGER_FQN = "pyfast_buffer.integrations.verl.PacedAgentLoopManager"


def select(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg.a.b.c`` for ``dotted="a.b.c"`` (dicts, DictConfigs or attributes); ``default`` when absent or None."""
    for part in dotted.split("."):
        cfg = read(cfg, part)
        if cfg is None:
            return default
    return cfg


@dataclass(frozen=True)
class VerlKeys:
    """What verl's trainer config says, as the sampler reads it (``found`` False: no trainer was reachable)."""

    found: bool = False
    trainer_mode: Optional[str] = None
    filter_enable: bool = False
    filter_metric: Optional[str] = None
    max_inflight_gen_batches: int = 1
    max_num_gen_batches: int = 0
    reward_model_enable: bool = False
    reward_resource_pool: bool = False
    sync_refill_failed_groups: bool = False
    train_batch_size: Optional[int] = None
    gen_batch_size: Optional[int] = None  # data.gen_batch_size as set; verl's dataloader may force it to 1 later
    parameter_sync_step: int = 1
    manager_class: Optional[str] = None

    @property
    def exact_refills(self) -> bool:
        """verl forces ``data.gen_batch_size=1`` (``_init_dataloader``) exactly when this is true."""
        return self.trainer_mode != "sync" or self.filter_enable or self.sync_refill_failed_groups

    def dataloader_batch(self) -> Optional[int]:
        """The prompts one dataloader fetch returns, so ``refill_fn(k)`` needs ``k`` a multiple of it."""
        if self.exact_refills:
            return 1
        return self.gen_batch_size or self.train_batch_size


def trainer_config(refill_fn: Optional[Callable[..., Any]]) -> Any:
    """The verl config of the trainer ``refill_fn`` is bound to, or None (a plain function, or not verl's)."""
    trainer = getattr(refill_fn, "__self__", None)
    config = getattr(trainer, "config", None)
    if config is None or select(config, "trainer.v1") is None or select(config, "data") is None:
        return None
    return config


def verl_keys(refill_fn: Optional[Callable[..., Any]]) -> VerlKeys:
    """Reads verl's keys from the trainer behind ``refill_fn`` (``VerlKeys()`` when there is none)."""
    config = trainer_config(refill_fn)
    if config is None:
        return VerlKeys()
    mode = select(config, "trainer.v1.trainer_mode", "sync")
    metric = select(config, "algorithm.filter_groups.metric")
    return VerlKeys(
        found=True,
        trainer_mode=mode,
        filter_enable=bool(select(config, "algorithm.filter_groups.enable", False)),
        filter_metric=None if metric is None else str(metric),
        max_inflight_gen_batches=select(config, "algorithm.filter_groups.max_inflight_gen_batches", 1),
        max_num_gen_batches=select(config, "algorithm.filter_groups.max_num_gen_batches", 0),
        reward_model_enable=bool(select(config, "reward.reward_model.enable", False)),
        reward_resource_pool=bool(select(config, "reward.reward_model.enable_resource_pool", False)),
        sync_refill_failed_groups=bool(select(config, "trainer.v1.sampler.sync_refill_failed_groups", False)),
        train_batch_size=select(config, "data.train_batch_size"),
        gen_batch_size=select(config, "data.gen_batch_size"),
        parameter_sync_step=select(config, f"trainer.v1.{mode}.parameter_sync_step", 1),
        manager_class=select(config, MANAGER_KEY),
    )
