"""``StalenessDataSource``: slime's ``DataSource`` over our buffer, its prompts from slime's own
``RolloutDataSourceWithBuffer``. Imports slime, so the package loads it on first use."""

from __future__ import annotations

from typing import Any

from slime.rollout.data_source import DataSource, RolloutDataSourceWithBuffer

from pyfast_buffer.integrations.slime._options import read_options
from pyfast_buffer.integrations.slime._source_core import StalenessSourceCore


class StalenessDataSource(StalenessSourceCore, DataSource):
    """``--data-source-path pyfast_buffer.integrations.slime.StalenessDataSource``, built by slime as ``cls(args)``.

    Prompts, epochs, shuffling and slime's requeue buffer (with ``--buffer-filter-path``) are slime's own; the
    finished groups and the staleness bound are ours. Use it with our rollout function
    (``--rollout-function-path pyfast_buffer.integrations.slime.generate_rollout_fully_async``): it completes and
    takes the groups this dispatches."""

    def __init__(self, args: Any) -> None:
        read_options(args)  # our checks first: slime's class would fail on bad args with its own AttributeError
        super().__init__(args, RolloutDataSourceWithBuffer(args))
