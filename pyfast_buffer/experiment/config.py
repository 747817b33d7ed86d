"""What one experiment holds fixed (ExperimentConfig), what an arm varies (ArmConfig), and presets."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

STRATEGIES = ("drop", "wait", "pace")
MODES = ("interleave", "thread")
#: ``--max-age adaptive`` without a target: hold the trainer's approx KL at this, PPO's customary KL target,
#: about what the reuse-1 arm (fresh data, rollouts one step behind) measures in the demo configuration.
DEFAULT_ADAPTIVE_KL = 0.01


@dataclass(frozen=True)
class ArmConfig:
    """The knobs an arm varies; everything else is the experiment's and is shared by every arm."""

    reuse: int = 1  # the buffer's max_uses: times one trajectory may be trained on
    strategy: str = "drop"  # drop stale entries at take, or wait for in-flight prompts
    max_age: int = 4  # drop: entries older than this (trainer steps) are dropped; wait: blocks on in-flight
    # prompts at this age but still trains ready entries past it
    lag: int = 0  # rollout weights are those of (sync step - lag)
    max_attempts: Optional[int] = None  # the buffer's max_attempts: the k-th untrained attempt is protected
    # Adaptive arms: an AdaptiveMaxAge controller moves max_age (the starting value) between trainer steps,
    # within the experiment's [adaptive_min_age, adaptive_max_age], to hold this approx KL or clip fraction.
    target_kl: Optional[float] = None
    target_clip: Optional[float] = None
    # A weight push reaches running generations (the slot generator, ExperimentConfig.slots): the trained tokens
    # are sampled with the weights in force at the finish, and the buffer measures age from it (age_from="finish").
    in_flight_updates: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.in_flight_updates, bool):
            raise TypeError(f"in_flight_updates={self.in_flight_updates!r} must be True or False")
        for target in ("target_kl", "target_clip"):
            value = getattr(self, target)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
            ):
                raise ValueError(f"{target}={value!r} must be a finite number > 0; pass e.g. adaptive:0.01")
        for name in ("reuse", "max_age", "lag"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name}={value!r} must be an int")
        if self.reuse < 1:
            raise ValueError(f"reuse={self.reuse} must be >= 1 (1 = each trajectory trained on once)")
        if self.max_age < 0:
            raise ValueError(f"max_age={self.max_age} must be >= 0")
        if self.lag < 0:
            raise ValueError(f"lag={self.lag} must be >= 0 (0 = rollouts use the latest synced weights)")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is unknown; pass one of {', '.join(STRATEGIES)}")
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1
        ):
            raise ValueError(f"max_attempts={self.max_attempts!r} must be an int >= 1 (or left out for no cap)")

    @property
    def adaptive(self) -> bool:
        return self.target_kl is not None or self.target_clip is not None

    @property
    def max_age_spec(self) -> str:
        """The ``--max-age`` item that makes this arm: ``"4"``, ``"adaptive:kl=0.01"``, ``"adaptive:clip=0.05"``."""
        if not self.adaptive:
            return str(self.max_age)
        parts = ([f"kl={self.target_kl:g}"] if self.target_kl is not None else []) + (
            [f"clip={self.target_clip:g}"] if self.target_clip is not None else []
        )
        return "adaptive:" + "+".join(parts)

    @property
    def name(self) -> str:
        age = self.max_age_spec.replace(":", "-") if self.adaptive else f"age{self.max_age}"
        cap = f"-att{self.max_attempts}" if self.max_attempts is not None else ""
        inflight = "-inflight" if self.in_flight_updates else ""
        return f"reuse{self.reuse}-{self.strategy}{inflight}{cap}-{age}-lag{self.lag}"


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything held fixed across arms: seed, task, model, batch sizes, capacity, sampling budget."""

    seed: int = 0
    digits: int = 10  # task: digits in [0, digits)
    length: int = 2  # task: response length in digits
    group_size: int = 8  # GRPO n: samples per prompt
    prompts_per_tick: int = 8  # prompts dispatched per sampling step
    batch_size: int = 64  # trajectories per trainer step (a multiple of group_size)
    capacity: int = 256  # ready trajectories the buffer holds
    ticks: int = 300  # total sampling steps, the same for every arm
    eval_interval: int = 25  # sampling steps between evaluations
    eval_prompts: int = 200  # fixed eval prompts (from the training distribution), greedy decoding
    parameter_sync_step: int = 1
    latency_mean: float = 0.5  # mean extra sampling steps a prompt stays in flight (geometric)
    max_latency: int = 6  # longest a prompt stays in flight, in sampling steps
    fail_prob: float = 0.02  # share of dispatched prompts that fail (never complete)
    lr: float = 3e-3
    clip_eps: float = 0.2
    hidden: int = 64
    mode: str = "interleave"  # interleave: deterministic; thread: a real producer thread
    tick_seconds: float = 0.01  # thread mode: the producer's pause between sampling steps
    max_steps_per_tick: int = 0  # trainer steps per sampling step at most (0: as many as full batches allow)
    adaptive_min_age: int = 1  # adaptive arms: the controller's bounds on max_age
    adaptive_max_age: int = 8
    # The bias study (requeue.py, rollout_cost.py): lost prompts are dispatched again, and a rollout's time
    # grows with its prompt's difficulty and its modelled length (tokens) instead of the geometric latency.
    requeue: bool = False
    base_tokens: int = 32  # modelled length of the easiest prompt's answer, before the lognormal factor
    length_sigma: float = 0.6  # sigma of that lognormal factor (the tail)
    tokens_per_tick: float = 64.0  # tokens a rollout writes per sampling step
    # The goodput study (slots.py): 0 keeps the open-loop producer (prompts_per_tick every step); K > 0 is a
    # generator with K concurrent generation slots, each attempt holding one until it finishes (needs requeue).
    slots: int = 0

    def __post_init__(self) -> None:
        def flag(name: str) -> str:
            return f"--{name.replace('_', '-')}"

        for name in (
            "seed",
            "digits",
            "length",
            "group_size",
            "prompts_per_tick",
            "batch_size",
            "capacity",
            "ticks",
            "eval_interval",
            "eval_prompts",
            "parameter_sync_step",
            "max_latency",
            "hidden",
            "max_steps_per_tick",
            "adaptive_min_age",
            "adaptive_max_age",
            "base_tokens",
            "slots",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{flag(name)}={value!r} must be an int")
        if not isinstance(self.requeue, bool):
            raise TypeError(f"requeue={self.requeue!r} must be True or False")
        positive = (
            "group_size",
            "prompts_per_tick",
            "batch_size",
            "capacity",
            "ticks",
            "eval_interval",
            "eval_prompts",
            "parameter_sync_step",
            "hidden",
            "base_tokens",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{flag(name)}={getattr(self, name)} must be >= 1")
        if self.digits < 2:
            raise ValueError(f"--digits={self.digits} leaves nothing to learn; pass --digits 2 or more")
        if self.length < 2:
            raise ValueError(f"--length={self.length} cannot reach every sum of two digits; pass --length 2 or more")
        if self.seed < 0:
            raise ValueError(f"--seed={self.seed} must be >= 0")
        if self.slots < 0:
            raise ValueError(f"--slots={self.slots} must be >= 0 (0 = the open-loop producer)")
        if self.slots and not self.requeue:
            raise ValueError(
                f"--slots={self.slots} needs the requeue producer (a freed slot takes a lost prompt first); "
                "use --preset goodput or goodput-tiny, which set it"
            )
        if self.max_latency < 0:
            raise ValueError(f"--max-latency={self.max_latency} must be >= 0")
        if self.max_steps_per_tick < 0:
            raise ValueError(f"--max-steps-per-tick={self.max_steps_per_tick} must be >= 0 (0 = no cap)")
        if not 0 <= self.adaptive_min_age <= self.adaptive_max_age:
            raise ValueError(
                f"--adaptive-min-age={self.adaptive_min_age} and --adaptive-max-age="
                f"{self.adaptive_max_age} must satisfy 0 <= min <= max"
            )
        for name, lo, lo_ok, example in (
            ("lr", 0.0, False, "3e-3"),
            ("clip_eps", 0.0, False, "0.2"),
            ("latency_mean", 0.0, True, "0.5"),
            ("tick_seconds", 0.0, True, "0.01"),
            ("fail_prob", 0.0, True, "0.02"),
            ("length_sigma", 0.0, True, "0.6"),
            ("tokens_per_tick", 0.0, False, "64"),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{flag(name)}={value!r} must be a number; pass e.g. {example}")
            if not math.isfinite(value) or value < lo or (value == lo and not lo_ok):
                raise ValueError(
                    f"{flag(name)}={value!r} must be a finite number {'>=' if lo_ok else '>'} {lo:g}; "
                    f"pass e.g. {example}"
                )
        if self.fail_prob >= 1.0:
            raise ValueError(
                f"--fail-prob={self.fail_prob} must be below 1 (some prompts must complete); pass e.g. 0.02"
            )
        if self.batch_size % self.group_size:
            raise ValueError(
                f"batch_size={self.batch_size} is not a multiple of group_size={self.group_size}; "
                "groups are never split, so pass a multiple"
            )
        if self.capacity < self.batch_size:
            raise ValueError(
                f"capacity={self.capacity} is below batch_size={self.batch_size}; pass a capacity of at least one batch"
            )
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is unknown; pass one of {', '.join(MODES)}")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    """A named experiment: its fixed configuration, its arms and the seeds it runs by default."""

    config: ExperimentConfig
    arms: List[ArmConfig] = field(default_factory=list)
    seeds: Tuple[int, ...] = (0,)


def _arms(*specs: tuple) -> List[ArmConfig]:
    return [ArmConfig(reuse=r, strategy=s, max_age=a, lag=lag) for r, s, a, lag in specs]


#: The staleness-bound study's arms: reuse 4 under drop with rollouts one step behind, max_age fixed at
#: 1, 2, 4, 8 or adaptive (starting at 4, held at approx KL DEFAULT_ADAPTIVE_KL, within [1, 8]), and reuse 1
#: (max_age 4) as the near-on-policy reference.
STUDY_ARMS = [
    *_arms(*[(4, "drop", a, 1) for a in (1, 2, 4, 8)]),
    ArmConfig(reuse=4, strategy="drop", max_age=4, lag=1, target_kl=DEFAULT_ADAPTIVE_KL),
    ArmConfig(reuse=1, strategy="drop", max_age=4, lag=1),
]

PRESETS: Dict[str, Preset] = {
    # Seconds: the test suite's preset. Easy task (base reward about 0.14), a higher learning rate.
    "tiny": Preset(
        ExperimentConfig(
            digits=5,
            length=2,
            group_size=8,
            prompts_per_tick=4,
            batch_size=32,
            capacity=128,
            ticks=100,
            eval_interval=25,
            eval_prompts=100,
            hidden=32,
            lr=1e-2,
        ),
        _arms((1, "drop", 4, 1), (4, "drop", 4, 1), (4, "wait", 4, 1)),
    ),
    # About 35 s on 2 CPU cores: reuse 1/2/4 under drop, wait and pace, rollouts one step behind; one seed.
    "demo": Preset(
        ExperimentConfig(ticks=600, eval_interval=50),
        _arms(*[(r, s, 4, 1) for s in ("drop", "wait", "pace") for r in (1, 2, 4)]),
    ),
    # The multi-seed study docs/experiment.md reports: 6 arms x 5 seeds x 600 sampling steps, 188 CPU-seconds
    # measured (30 runs of 3-10 s each; the wall time depends on --jobs and on what else the cores run).
    "study": Preset(ExperimentConfig(ticks=600, eval_interval=50), STUDY_ARMS, seeds=tuple(range(5))),
    # The rhythm planner's FIFO case, for planner-vs-measured: one trainer step per sampling step, production
    # (48 a step) above consumption (32), so the buffer fills and evicts oldest first; weights pushed every
    # 2 steps; constant latency (the lag), no failures, no drops (max_age far above the ages). Seconds.
    "fifo": Preset(
        ExperimentConfig(
            digits=5,
            length=2,
            group_size=8,
            prompts_per_tick=6,
            batch_size=32,
            capacity=160,
            ticks=60,
            eval_interval=30,
            eval_prompts=50,
            hidden=32,
            lr=1e-2,
            latency_mean=0.0,
            max_latency=0,
            fail_prob=0.0,
            max_steps_per_tick=1,
            parameter_sync_step=2,
        ),
        _arms((1, "drop", 100, 0), (1, "drop", 100, 1)),
    ),
}


def _bias_arms(max_age: int) -> List[ArmConfig]:
    """The bias study's arms at one max_age: drop, wait, pace, and drop with max_attempts=2."""
    return [
        ArmConfig(reuse=1, strategy="drop", max_age=max_age, lag=1),
        ArmConfig(reuse=1, strategy="wait", max_age=max_age, lag=1),
        ArmConfig(reuse=1, strategy="pace", max_age=max_age, lag=1),
        ArmConfig(reuse=1, strategy="drop", max_age=max_age, lag=1, max_attempts=2),
    ]


#: The bias study (docs/data-bias.md): lost prompts requeued, rollout time growing with difficulty and
#: length (heavy-tailed), the same max_age in every arm, five seeds.
_BIAS_CONFIG = ExperimentConfig(
    ticks=400,
    eval_interval=50,
    requeue=True,
    max_latency=12,
    latency_mean=0.0,
    fail_prob=0.02,
    capacity=512,
)
PRESETS["bias"] = Preset(_BIAS_CONFIG, _bias_arms(2), seeds=tuple(range(5)))
# The same study in seconds, for CI: the tiny preset's task and model, 60 steps, two seeds.
PRESETS["bias-tiny"] = Preset(
    replace(
        PRESETS["tiny"].config,
        requeue=True,
        max_latency=12,
        latency_mean=0.0,
        ticks=60,
        eval_interval=30,
        eval_prompts=50,
        capacity=256,
    ),
    _bias_arms(2),
    seeds=(0, 1),
)


def goodput_arms(ages: Tuple[int, ...] = (1, 2, 4, 8)) -> List[ArmConfig]:
    """The goodput frontier's arms: at each max_age, drop, wait, pace, and drop and pace with in-flight weight
    updates (age from the finish; drop's is the like-for-like reference for pace's), reuse 1, rollouts one step
    behind."""
    kinds = (("drop", False), ("wait", False), ("pace", False), ("drop", True), ("pace", True))
    return [
        ArmConfig(reuse=1, strategy=strategy, max_age=age, lag=1, in_flight_updates=inflight)
        for age in ages
        for strategy, inflight in kinds
    ]


#: The goodput study (docs/data-bias.md, "The throughput price of a hard bound"): the bias study's rollout cost and
#: requeue loop on a generator of 16 slots (about 7 prompts a sampling step at the mean rollout time, against a
#: trainer that takes one batch of 8 groups a step at most), so both sides are close to busy and neither strategy
#: gets spare hardware for free; max_age 1, 2, 4, 8 x {drop, wait, pace, and drop and pace with in-flight updates},
#: five seeds.
PRESETS["goodput"] = Preset(
    replace(_BIAS_CONFIG, slots=16, max_steps_per_tick=1), goodput_arms(), seeds=tuple(range(5))
)
# The same frontier in under a minute, for CI: bias-tiny's task and model on 8 slots, 60 steps, two seeds.
PRESETS["goodput-tiny"] = Preset(
    replace(PRESETS["bias-tiny"].config, slots=8, max_steps_per_tick=1), goodput_arms(), seeds=(0, 1)
)


def preset(name: str) -> Preset:
    """Returns the named preset, or raises ValueError listing the names."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; pass one of {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def with_overrides(config: ExperimentConfig, **overrides: Any) -> ExperimentConfig:
    """Returns ``config`` with the non-None overrides applied (and validated again)."""
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})
