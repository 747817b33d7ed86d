"""TRL's AsyncGRPOTrainer with pyfast_buffer's StalenessRolloutWorker, on a CPU, as is: ``pace`` (admission control:
nothing dropped, nothing trained past max_age) on a tiny policy built in code, then a resume from its checkpoint.

    pip install "pyfast_buffer[trl]"
    python examples/trl_async_grpo.py [--strategy pace] [--max-age 2] [--steps 12]

On a GPU with a vLLM server, drop ``CpuGenerator`` and ``use_cpu_kernels``: the worker's default ``complete`` talks
to the server (``vllm_server_url``), and TRL's own weight transfer pushes the weights there (docs/trl.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import tempfile
import warnings

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from pyfast_buffer.integrations.trl import StalenessRolloutWorker
from pyfast_buffer.integrations.trl.cpu import CpuGenerator, use_cpu_kernels
from pyfast_buffer.integrations.trl.tiny import sum_dataset, sum_reward, tiny_policy


def train(folder, model, tokenizer, args, steps, resume=None):
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    dataset = sum_dataset(64)
    # generation is slow and uneven (a straggler now and then), so groups really fall behind the trainer
    generator = CpuGenerator(model, latency=lambda rng: 0.3 if rng.random() < 0.15 else rng.uniform(0, 0.05))
    worker = StalenessRolloutWorker(
        dataset=dataset,
        processing_class=tokenizer,
        reward_funcs=[sum_reward],
        num_generations=4,
        max_completion_length=4,
        strategy=args.strategy,
        max_age=args.max_age,
        complete=generator.complete,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' own deprecation notices
        config = AsyncGRPOConfig(
            output_dir=os.path.join(folder, "out"),
            per_device_train_batch_size=8,  # two groups of 4 a step
            num_generations=4,
            max_completion_length=4,
            token_budget=0,
            max_steps=steps,
            save_steps=args.steps // 2,
            logging_steps=1,
            max_staleness=args.max_age,  # TRL's own filter, at our bound: it finds nothing to drop
            learning_rate=0.05,
            use_cpu=True,
            dtype="float32",
            report_to="none",
            disable_tqdm=True,
        )
        trainer = AsyncGRPOTrainer(
            model=model,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            reward_funcs=[sum_reward],
            rollout_worker=worker,
            weight_transfer=generator.weight_transfer,
            callbacks=worker.callbacks,
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints every log line when tqdm is off
            trainer.train(resume_from_checkpoint=resume)
    return trainer, worker


def report(title, trainer, worker):
    history = [h for h in trainer.state.log_history if "loss" in h]
    trl_dropped = sum(h.get("sample/dropped_stale_total", 0) or 0 for h in history)
    staleness = max(h.get("sample/staleness_max", 0) or 0 for h in history)
    ledger = worker.buffer.ledger()
    balanced = (
        ledger["put_total"] == ledger["retired"] + ledger["dropped_stale"] + ledger["evicted"] + ledger["buffer_left"]
    )
    print(f"{title}: {trainer.state.global_step} steps, strategy={worker.strategy}, max_age={worker.max_age}")
    print(f"  TRL's log: staleness max {staleness:.0f}, samples TRL's filter dropped {trl_dropped:.0f}")
    print(
        f"  our ledger: {ledger['taken']} trained, {ledger['dropped_stale']} dropped stale, "
        f"{ledger['trained_over_age']} trained past max_age, {ledger['admission_refused']} admissions refused, "
        f"{ledger['failed']} failed, {ledger['buffer_left']} ready, balanced: "
        f"{balanced}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=["drop", "wait", "pace"], default="pace")
    parser.add_argument("--max-age", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    random.seed(0)
    use_cpu_kernels()  # TRL's FlashAttention-3 kernel and its CUDA peak-FLOPs query, replaced for the CPU
    folder = tempfile.mkdtemp(prefix="pfb-trl-example-")
    model, tokenizer = tiny_policy(os.path.join(folder, "model"))
    half = args.steps // 2
    trainer, worker = train(folder, model, tokenizer, args, half)
    report("first run", trainer, worker)
    checkpoint = os.path.join(folder, "out", f"checkpoint-{half}")
    trainer, worker = train(folder, model, tokenizer, args, args.steps, resume=checkpoint)
    report(f"resumed from checkpoint-{half}", trainer, worker)


if __name__ == "__main__":
    main()
