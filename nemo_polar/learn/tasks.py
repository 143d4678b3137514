"""The task family the loop learns: "which of two numbers is bigger?", answered with the number.

Chosen because a 135M instruct model at temperature 1 answers it right ~15% of the time (measured: it rambles,
restates the question, or names the wrong number), so a GRPO group has reward variance from the first step, and the
checker is exact. Train and held-out prompts are disjoint pairs: the held-out reward shows what the update taught,
not what it memorised.
"""

from __future__ import annotations

import random
import re

from pydantic import BaseModel

PROMPT = "Which number is bigger, {a} or {b}? Answer with only the number."
_FIRST_INTEGER = re.compile(r"-?\d+")


class Task(BaseModel):
    task_id: str
    prompt: str
    answer: int

    def reward(self, reply: str) -> float:
        """1.0 when the reply's first integer is the bigger number (the answer "with only the number" comes first),
        else 0.0; a reply with no integer scores 0."""
        first = _FIRST_INTEGER.search(reply)
        return float(first is not None and int(first.group(0)) == self.answer)


def _pairs(low: int, high: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(low, high + 1) for b in range(low, high + 1) if a != b]


def split(seed: int, held_out: int, *, low: int = 1, high: int = 30) -> tuple[list[Task], list[Task]]:
    """All ordered pairs of distinct numbers in ``[low, high]``, shuffled by ``seed``: the first ``held_out`` are the
    held-out set, the rest the training pool. An unordered pair never sits on both sides."""
    unordered = sorted({(min(a, b), max(a, b)) for a, b in _pairs(low, high)})
    rng = random.Random(seed)
    rng.shuffle(unordered)
    tasks = []
    for a, b in unordered:
        if rng.random() < 0.5:
            a, b = b, a
        tasks.append(Task(task_id=f"bigger-{a}-{b}", prompt=PROMPT.format(a=a, b=b), answer=max(a, b)))
    return tasks[held_out:], tasks[:held_out]
