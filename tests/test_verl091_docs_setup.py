"""The setup in docs/verl.md, copied as a new user would, runs verl 0.9.1's trainer loop on CPU as is.

The override lines under ``<!-- verl-setup: drop -->`` and ``<!-- verl-setup: pace -->`` are read from the page
and handed to verl's Hydra config unchanged, on top of what any CPU run needs (``base_overrides``: paths and
sizes); the YAML block is merged the way a config file would be. Needs ``verl==0.9.1``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("verl", minversion="0.9.1", reason="verl 0.9.1 is not installed (bash .ci/verl-stage.sh)")
pytest.importorskip("transfer_queue", reason="TransferQueue is not installed: pip install '.[verl]'")

from _verl_cpu_trainer import (
    VERL_OWN_WARNINGS,
    balanced,
    base_overrides,
    clear_transfer_queue,
    compose,
    stop,
    train,
)

pytestmark = [pytest.mark.filterwarnings(w) for w in VERL_OWN_WARNINGS]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "verl.md"


def setup_lines(strategy: str) -> list:
    """The override lines of the page's fenced block after ``<!-- verl-setup: strategy -->``."""
    text = PAGE.read_text()
    match = re.search(rf"<!-- verl-setup: {strategy} -->\s*```bash\n(.*?)```", text, re.S)
    assert match, f"docs/verl.md has no verl-setup block for {strategy}"
    return [line.strip() for line in match.group(1).splitlines() if line.strip() and not line.startswith("#")]


def yaml_block() -> str:
    text = PAGE.read_text()
    match = re.search(r"The same in a YAML config:\s*```yaml\n(.*?)```", text, re.S)
    assert match, "docs/verl.md has no YAML config block"
    return match.group(1)


@pytest.mark.parametrize("strategy", ["drop", "pace"])
def test_the_two_lines_per_strategy_from_the_docs_run_verls_loop(verl_cpu, tmp_path, strategy):
    lines = setup_lines("drop") + (setup_lines("pace") if strategy == "pace" else [])
    assert len(lines) == (2 if strategy == "drop" else 4)
    clear_transfer_queue()
    config = compose(base_overrides(tmp_path, "colocate_async", 10) + lines)
    run = train(config, {"seed": 1})
    stop(run)
    rb = run.trainer.replay_buffer
    assert type(rb).__module__.startswith("pyfast_buffer.") and rb.paced == (strategy == "pace")
    assert type(run.manager).__mro__[1].__name__ == (
        "PacedAgentLoopManager" if strategy == "pace" else "AgentLoopManagerTQ"
    )
    assert len(run.record.steps) == 10
    balanced(rb.ledger("train"), paced=strategy == "pace")


def test_the_yaml_config_from_the_docs_runs_verls_loop(verl_cpu, tmp_path):
    from omegaconf import OmegaConf, open_dict

    clear_transfer_queue()
    config = compose(base_overrides(tmp_path, "colocate_async", 10))
    with open_dict(config):  # a config file may add keys verl's schema does not declare (the manager class)
        config.merge_with(OmegaConf.create(yaml_block()))
    run = train(config, {"seed": 1})
    stop(run)
    rb = run.trainer.replay_buffer
    assert rb.paced and rb.max_off_policy_threshold == 2 and len(run.record.steps) == 10
