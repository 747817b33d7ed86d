"""verl 0.9.1's real trainer on CPU: verl's composed Hydra config, verl's trainer classes and their loop.

What runs is verl's: ``ppo_trainer`` composed by Hydra from the installed package, the trainer class
``trainer.v1.trainer_mode`` names (``get_trainer_cls``), its ``__init__`` (which builds the sampler from
``custom_sampler``), its tokenizer and dataloader (a tiny local model directory and parquet file), ``fit`` with
its warm-up, ``prepare_step``, ``step``, the sampler calls, the hooks, checkpoints and TransferQueue cleanup,
and the agent-loop manager class the config names (verl's ``AgentLoopManagerTQ`` or ours).

What is faked, because it needs GPUs: the worker groups, the inference engines (``_verl_fake_rollout``), the
checkpoint-engine managers (which push the weight version to the fake engines, and pause and resume them as
verl's sleep/abort/wake do) and the training stages after ``sample`` (old log-prob, advantages, the actor
update): they pass the batch through, the update sleeps ``TRAIN_S`` and records what was trained.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import ray
from _verl_fake_rollout import FakeLLMServer, with_fake_workers

TRAIN_S = 0.02  # the fake actor update: a step's training time
#: Warnings verl 0.9.1 itself raises on this machine (its imports, its dataloader): filtered in the verl test
#: modules, whose other warnings stay errors (pytest's filterwarnings = error).
VERL_OWN_WARNINGS = [
    "ignore:Ray state API is no longer experimental:DeprecationWarning",  # verl imports ray.experimental.state
    "ignore:.* engine is not available:UserWarning",  # verl's optional training engines (GPU only)
    "ignore:Warning. Function 'verl.utils.import_utils.load_extern_type' is deprecated:FutureWarning",
    "ignore:'set_vital' is deprecated:UserWarning",  # torchdata's StatefulDataLoader, verl's dataloader
]
VOCAB = [
    "what",
    "is",
    "one",
    "two",
    "three",
    "four",
    "five",
    "plus",
    "minus",
    "times",
    "the",
    "answer",
    "user",
    "assistant",
]


def import_verl() -> None:
    """Imports verl's trainer package under VERL_OWN_WARNINGS (a module imported at collection time is outside
    the test modules' filterwarnings marks)."""
    import builtins
    import warnings

    with warnings.catch_warnings():
        for spec in VERL_OWN_WARNINGS:
            _, message, category = spec.split(":", 2)
            warnings.filterwarnings("ignore", message=message, category=getattr(builtins, category))
        import verl.trainer.ppo.v1  # noqa: F401


def tiny_model_dir(root: Path) -> Path:
    """A model directory verl's HFModelConfig loads offline: a word-level tokenizer with a chat template and a
    one-layer Qwen2 config (no weights: nothing here runs the model)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(VOCAB)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    tokenizer.save_pretrained(root)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
        "vocab_size": len(vocab),
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
    }
    (root / "config.json").write_text(json.dumps(config))
    return root


def tiny_dataset(path: Path, rows: int) -> Path:
    """verl's RL parquet layout (chat prompt, data_source, reward_model, extra_info.index), ``rows`` rows."""
    import pandas as pd

    pd.DataFrame(
        [
            {
                "data_source": "toy",
                "prompt": [{"role": "user", "content": f"what is {VOCAB[2 + i % 5]} plus {VOCAB[2 + i % 3]}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(i % 5 + i % 3)},
                "extra_info": {"index": i},
            }
            for i in range(rows)
        ]
    ).to_parquet(path)
    return path


def base_overrides(tmp: Path, mode: str, steps: int, batch: int = 8, n: int = 2) -> list:
    """The Hydra overrides a CPU run needs on top of verl's ``ppo_trainer`` (paths, sizes, no GPU pools)."""
    model = tiny_model_dir(tmp / "model")
    data = tiny_dataset(tmp / "train.parquet", 256)
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={batch}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"trainer.v1.trainer_mode={mode}",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[]",
        f"trainer.default_local_dir={tmp / 'checkpoints'}",
        "transfer_queue.enable=true",
        "algorithm.adv_estimator=grpo",  # GRPO groups, no critic
        "critic.enable=false",
    ]
    if mode == "separate_async":
        overrides += [
            "trainer.v1.separate_async.parameter_sync_step=2",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={batch // 2}",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
        ]
    return overrides


def compose(overrides: list) -> Any:
    """verl's own ``ppo_trainer`` config from the installed package, with ``overrides``, resolved (as TaskRunner)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = hydra_compose(config_name="ppo_trainer", overrides=overrides)
    OmegaConf.resolve(config)
    return config


class FakeCheckpointManager:
    """verl's CheckpointEngineManager as the trainers call it: pushes the step as the weight version to the fake
    engines; ``pauses`` True makes sleep/abort pause generation until the next wake (colocated replicas)."""

    def __init__(self, server: Any, pauses: bool) -> None:
        self.server, self.pauses = server, pauses
        self.pushed: list = []

    def update_weights(self, global_steps: Optional[int] = None) -> dict:
        if global_steps is not None:
            ray.get(self.server.set_version.remote(global_steps))
            self.pushed.append(global_steps)
        ray.get(self.server.resume.remote())
        return {}

    def sleep_replicas(self) -> None:
        if self.pauses:
            ray.get(self.server.pause.remote())

    def abort_replicas(self, reject_request: bool = False) -> None:
        self.sleep_replicas()

    def resume_generation_replicas(self) -> None:
        ray.get(self.server.resume.remote())


class FakeWorkerGroup:
    """The actor worker group's calls that the loop makes outside the faked training stages."""

    def save_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        Path(local_path).mkdir(parents=True, exist_ok=True)

    def load_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Callable[..., None]:  # save_model_to_cpu, start_profile, ...
        return lambda *args, **kwargs: None


@ray.remote(num_cpus=0)
class FakeLoadBalancer:
    """separate_async's global load balancer: which hybrid servers are routed to."""

    def __init__(self) -> None:
        self.servers: dict = {}
        self.switches = 0

    def add_servers(self, servers: dict) -> None:
        self.servers.update(servers)
        self.switches += 1

    def remove_servers(self, addresses: list) -> None:
        for address in addresses:
            self.servers.pop(address, None)
        self.switches += 1

    def clear_sticky_cache(self) -> dict:
        return {}

    def count(self) -> int:
        return self.switches


@dataclass
class Record:
    """What one run trained and how long it waited, step by step."""

    trained: list = field(default_factory=list)  # (global_steps, trajectory tags) per actor update
    steps: list = field(default_factory=list)  # per global step: {"gen_s", "step_s", "ledger"}
    metrics: list = field(default_factory=list)  # the sampler's metrics dict merged per step

    def trained_prompts(self) -> list:
        return [key.split("_", 1)[0] for _, tags in self.trained for key in (t["__key__"] for t in tags)]


def cpu_trainer_class(mode: str, check_step: Optional[Callable[[Any], None]] = None) -> type:
    """verl's registered trainer for ``mode``, with the GPU pieces replaced (see the module docstring).

    ``check_step(trainer)`` runs after every step's ``on_step_end`` (a failing assert stops ``fit``)."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    base = get_trainer_cls(mode)

    class CpuTrainer(base):  # type: ignore[misc, valid-type]
        server: Any = None
        record: Record

        def _setup(self) -> None:
            self.record = Record()
            self._init_tokenizer()
            self._init_dataloader()
            self._init_dump_executor()
            self.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: 1)
            self.actor_rollout_wg = FakeWorkerGroup()
            self.ref_in_actor = False
            self.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[])  # streaming reward
            self.teacher_model_manager = None
            separate = mode == "separate_async"
            self.checkpoint_manager = FakeCheckpointManager(self.server, pauses=not separate)
            if separate:
                from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

                balancer = FakeLoadBalancer.remote()
                self.llm_server_manager = SimpleNamespace(server_addresses=["hybrid:0"], server_handles=[self.server])
                self.standalone_server_manager = SimpleNamespace(global_load_balancer=balancer)
                self.standalone_checkpoint_manager = FakeCheckpointManager(self.server, pauses=False)
                self.current_mode = (
                    HybridEngineMode.ROLLOUT if self._enable_hybrid_replicas else HybridEngineMode.TRAINER
                )
            self.checkpoint_manager.sleep_replicas()
            self._load_checkpoint()

        def _balance_batch(self, batch: Any, metrics: Any, *args: Any, **kwargs: Any) -> Any:
            return batch

        def _compute_old_log_prob(self, batch: Any, metrics: Any) -> Any:
            return batch

        def _compute_ref_log_prob(self, batch: Any, metrics: Any) -> Any:
            return batch

        def _compute_values(self, batch: Any, metrics: Any) -> Any:
            return batch

        def _compute_advantage(self, batch: Any, metrics: Any) -> Any:
            return batch

        def _update_critic(self, batch: Any, metrics: Any) -> Any:
            return batch

        def _update_actor(self, batch: Any, metrics: Any) -> Any:
            tags = [{**tag, "__key__": key} for key, tag in zip(batch.keys, batch.tags)]
            self.record.trained.append((self.global_steps, tags))
            time.sleep(TRAIN_S)
            return batch

        def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> None:
            self.record.metrics.append(dict(metrics))
            self.record.steps.append(
                {
                    "step": global_steps,
                    "gen_s": timing_raw.get("gen", 0.0) + timing_raw.get("switch_wait", 0.0),
                    "step_s": timing_raw.get("step", 0.0),
                }
            )

        def on_step_end(self) -> None:
            super().on_step_end()
            if check_step is not None:
                check_step(self)

    CpuTrainer.__name__ = f"Cpu{base.__name__}"
    return CpuTrainer


def agent_loop_manager(config: Any, server: Any) -> Any:
    """The manager class the config names (verl's default AgentLoopManagerTQ otherwise), built as verl's
    TaskRunner builds it, with fake workers behind it."""
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.utils.import_utils import load_class_from_fqn

    fqn = config.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_manager_class")
    cls = load_class_from_fqn(fqn, "AgentLoopManager") if fqn else AgentLoopManagerTQ
    return with_fake_workers(cls).create(
        config=config, llm_client=server, teacher_client=None, reward_loop_worker_handles=None
    )


@dataclass
class Run:
    trainer: Any
    manager: Any
    server: Any
    record: Record
    error: Optional[BaseException] = None


def train(
    config: Any,
    server_options: Optional[dict] = None,
    check_step: Optional[Callable[[Any], None]] = None,
    raise_errors: bool = True,
) -> Run:
    """Builds verl's trainer for ``config`` on CPU and runs ``fit`` with a fake backend; returns what happened."""
    server = FakeLLMServer.remote(**(server_options or {"seed": 0}))
    trainer = cpu_trainer_class(config.trainer.v1.trainer_mode, check_step)(config)
    trainer.server = server
    trainer.init()
    manager = agent_loop_manager(config, server)
    run = Run(trainer, manager, server, trainer.record)
    try:
        trainer.fit(manager)
    except BaseException as exc:
        run.error = exc
        if raise_errors:
            stop(run)
            raise
    return run


def stop(run: Run) -> None:
    """Kills the run's fake workers and engine, so nothing writes to TransferQueue after it."""
    for worker in getattr(run.manager, "agent_loop_workers", []):
        ray.kill(worker)
    ray.kill(run.server)


def clear_transfer_queue() -> None:
    import transfer_queue as tq

    for partition, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition)


def verl_on_cpu():
    """A local Ray (8 logical CPUs, as TransferQueue's placement groups ask) with this folder importable by its
    workers, and TransferQueue on it, as verl's TaskRunner starts them; a context manager."""
    import contextlib
    import os

    import transfer_queue as tq

    @contextlib.contextmanager
    def running():
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        ray.init(
            num_cpus=8,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
        tq.init()
        try:
            yield
        finally:
            tq.close()
            ray.shutdown()

    return running()


SAMPLER = [
    "trainer.v1.sampler.custom_sampler.path=pkg://pyfast_buffer.integrations.verl",
    "trainer.v1.sampler.custom_sampler.name=FastReplayBuffer",
]
PACED = [
    "trainer.v1.sampler.max_off_policy_strategy=pace",
    "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=pyfast_buffer.integrations.verl.PacedAgentLoopManager",
]


def balanced(ledger: dict, paced: bool) -> None:
    """The verl sampler's ledger identities (docs/verl.md, "The ledger"), pace's when ``paced``."""
    assert ledger["seen"] == ledger["taken"] + ledger["evicted"] + ledger["vanished"] + ledger["held"], ledger
    assert ledger["refill_requested"] == ledger["refill_delivered"] + ledger["refill_short"] + ledger["refill_failed"]
    assert ledger["core_dispatched"] == ledger["core_completed"] + ledger["core_failed"] + ledger["core_in_flight"]
    assert ledger["core_taken"] == ledger["taken"], ledger
    if paced:  # the core holds exactly the admitted prompts that are not yet taken or gone
        assert ledger["core_dispatched"] == ledger["admitted"], ledger
        core_held = ledger["core_in_flight"] + ledger["core_ready"] - ledger["ghosts"]
        assert ledger["held"] == ledger["awaiting_admission"] + ledger["unadmitted_ready"] + core_held, ledger
    else:
        assert ledger["core_in_flight"] == ledger["held"], ledger
