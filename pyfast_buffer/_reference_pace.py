"""The pace rule written the plain way, for ReferenceBuffer (the core's is csrc/admission.hpp).

Both functions take the age stamps of the outstanding prompt groups, one list entry per group, and count by
scanning them: obvious rather than fast. docs/design.md ("pace: the admission rule") states and proves the rule.
"""

from __future__ import annotations

from typing import List, Optional


def admissible(
    outstanding: List[int], step: int, next_take: int, max_age: int, prompts_per_step: int, lookahead: int
) -> int:
    """Returns how many prompts stamped ``step`` may start now.

    ``outstanding`` holds one stamp per in-flight prompt and per ready group; ``next_take`` is the step of the
    trainer's next take. Two limits: ``(lookahead + 1) * prompts_per_step`` outstanding groups in all, and for every
    stamp ``y >= step`` at most ``(y + max_age - next_take + 1) * prompts_per_step`` groups stamped ``<= y``.
    """
    room = (lookahead + 1) * prompts_per_step - len(outstanding)
    for y in sorted({step, *(s for s in outstanding if s > step)}):
        stamped_by_y = sum(1 for s in outstanding if s <= y)
        room = min(room, (y + max_age - next_take + 1) * prompts_per_step - stamped_by_y)
    return max(room, 0)


def blocker(
    in_flight: List[int], ready: List[int], taken_groups: int, current_step: int, max_age: int, prompts_per_step: int
) -> Optional[int]:
    """Returns the smallest in-flight stamp that a take of the ``taken_groups`` oldest ready groups at
    ``current_step`` would leave unable to be trained before it passes ``max_age``, or None."""
    left_ready = sorted(ready)[taken_groups:]
    for y in sorted(set(in_flight)):
        behind = sum(1 for s in in_flight if s <= y) + sum(1 for s in left_ready if s <= y)
        if behind > (y + max_age - current_step) * prompts_per_step:
            return y
    return None
