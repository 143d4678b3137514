"""``polar learn --harness``: the generated task family graded by swebench's own path, the teacher's session through
the Gym rollout path turned into the trainer's row as NeMo-RL builds it, and the trainer's harness-size forward
(a prefix shared by a micro-batch computed once, logits only where a token is trained) against the plain one."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.cli import main
from nemo_polar.engine.launcher import engine_python, resolve_model
from nemo_polar.env.gym.nemo_rl import trainer_row
from nemo_polar.env.gym.trajectory import trajectory
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.learn.harness_loop import Collected, HarnessLearnConfig, HarnessStep, grpo_rows, pipelined
from nemo_polar.learn.lookup_tasks import draw, write_task_repo
from nemo_polar.learn.report import HarnessLearnSummary, HarnessSeedSummary, render_harness_html
from nemo_polar.learn.rollouts import HarnessRollouts, PhaseStats, Rollout, SessionStats, busy_fraction, session_stats
from nemo_polar.learn.trainer import WORKER
from nemo_polar.proxy.conversation import Message, ToolCall
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.rewards.grader import grade
from tests.conftest import ProxyHandle
from tests.helpers.records import child, rec


def test_the_lookup_family_is_graded_as_swebench_grades_it(tmp_path: Path) -> None:
    splits = write_task_repo(tmp_path / "lookup", seed=5, train=4, held_out=2)
    train, held_out = splits["train"], splits["held_out"]
    assert (len(train), len(held_out)) == (4, 2)
    drawn = draw(5, 4, 2)
    assert draw(5, 4, 2)[0].value == drawn[0].value and draw(6, 4, 2)[0].value != drawn[0].value
    layouts = {(t.module, t.name) for t in drawn}
    assert len(layouts) == 6 and len({t.value for t in drawn}) == 6  # no held-out task repeats a training one
    task, inst = drawn[4], held_out[0]
    assert inst.instance_id == task.instance_id and inst.script and inst.eval_script
    assert str(task.value) not in inst.problem_statement  # only the data file holds the number
    assert (inst.repo_path / task.data_file).read_text().strip() == str(task.value)
    assert grade(inst, inst.patch, runtime="bwrap").resolved  # the gold patch
    assert grade(inst, "", runtime="bwrap").reward == 0.0
    wrong = inst.patch.replace(f"= {task.value}", f"= {task.value + 1}")
    graded = grade(inst, wrong, runtime="bwrap")
    assert not graded.resolved and graded.fail_to_pass == 0.0 and graded.pass_to_pass == 1.0
    with pytest.raises(ValueError, match="at most 64"):
        draw(0, 60, 5)


def _stats(reward: float, masked: bool = False) -> SessionStats:
    return SessionStats(
        instance_id="t", reward=reward, masked=masked, calls=2, tool_calls=1, valid_tool_calls=1, generated_tokens=10
    )


def test_grpo_rows_give_each_group_its_advantages_and_mask_what_the_verdict_masked() -> None:
    sample = {
        "message_log": [
            {"role": "user", "token_ids": [1, 2]},
            {"role": "assistant", "token_ids": [3, 4], "generation_logprobs": [-0.5, -0.25]},
            {"role": "user", "token_ids": [5]},
            {"role": "assistant", "token_ids": [6], "generation_logprobs": [-1.0]},
        ],
        "reward": 1.0,
        "loss_multiplier": 1.0,
    }
    row = trainer_row(sample, 0.5)
    assert row["input_ids"] == [1, 2, 3, 4, 5, 6] and row["token_mask"] == [0, 0, 1, 1, 0, 1]
    assert row["generation_logprobs"] == [0.0, 0.0, -0.5, -0.25, 0.0, -1.0]
    assert (row["advantage"], row["sample_mask"]) == (0.5, 1)
    masked = {**sample, "loss_multiplier": 0.0}
    rollouts = [
        Rollout(stats=_stats(1.0), sample=sample),
        Rollout(stats=_stats(0.0), sample=sample),
        Rollout(stats=_stats(0.0, masked=True), sample=masked),
        Rollout(stats=_stats(0.0), sample=None),  # no generation data: no row
        Rollout(stats=_stats(1.0), sample=sample),
        Rollout(stats=_stats(1.0), sample=sample),
    ]
    rows, signal = grpo_rows(rollouts, ["a", "a", "a", "a", "b", "b"])
    assert [(r["advantage"], r["sample_mask"]) for r in rows] == [
        (pytest.approx(2 / 3), 1),
        (pytest.approx(-1 / 3), 1),
        (0.0, 0),
        (0.0, 1),
        (0.0, 1),
    ]
    assert signal == 1  # group b's rewards are all 1: no signal
    stats = PhaseStats.of(rollouts)
    assert (stats.sessions, stats.masked, stats.reward) == (6, 1, 0.6)
    assert stats.valid_tool_call_rate == 0.5 and stats.tokens_per_session == 10


@pytest.mark.engine
def test_the_harness_report_shows_each_seeds_phases_and_curves() -> None:
    def phase(reward: float, valid: float) -> PhaseStats:
        return PhaseStats(
            sessions=24, masked=0, reward=reward, tool_call_rate=valid, valid_tool_call_rate=valid,
            sessions_with_valid_tool_calls=valid, tokens_per_session=100.0,
        )  # fmt: skip

    fields = {
        "harness": "pi", "base": phase(0.0, 0.0), "warmed": phase(0.2, 0.56), "final": phase(0.5, 0.64),
        "held_out_before": 0.2, "held_out_after": 0.5, "gain": 0.3, "reward_per_step": [0.4, 0.5],
        "valid_tool_call_rate_per_step": [0.6, 0.6], "tokens_per_session_per_step": [120.0, 110.0],
        "teacher": "script", "wall_s": 1400.0,
    }  # fmt: skip
    seeds = [HarnessSeedSummary(seed=seed, **fields) for seed in (0, 1)]
    summary = HarnessLearnSummary(harness="pi", seeds=seeds, mean_gain=0.3, gain_spread=0.0, outputs={})
    page = render_harness_html(summary)
    assert "polar learn through pi" in page and "+0.300" in page and "0.56 → 0.64" in page
    assert page.count("<tr>") == 3 and "data:image/png;base64," in page


def test_a_tool_call_without_arguments_is_read_as_empty_not_a_crash() -> None:
    """A record leaves a call's default ``arguments`` ("{}") out: the model wrote ``{"name": ""}``, or called a tool
    that takes none. Gym's trajectory and the loop's tool-call counts read it as ``{}``."""
    empty = Message(role="assistant", tool_calls=[ToolCall(id="c1", name="")]).recorded()
    bare = Message(role="assistant", tool_calls=[ToolCall(id="c2", name="read")]).recorded()
    assert "arguments" not in empty["tool_calls"][0]
    offered = {"tools": [{"type": "function", "function": {"name": "read"}}]}
    first = rec("a", [1, 2], [3, 4], output=empty, request=offered)
    records = [first, child("b", first, [5], [6], output=bare, request=offered)]
    turns = trajectory(records, "t", "r", "m")
    if turns is not None:  # the installed Gym has the trajectory model
        answers = [item for turn in turns["turns"] for item in turn["answer"]]
        assert [a["arguments"] for a in answers] == ["{}", "{}"]
    result = {"instance_id": "t", "reward": 0.0, "mask_sample": False}
    stats = session_stats(result, records)
    assert (stats.tool_calls, stats.valid_tool_calls) == (2, 1)  # the nameless call is not one the harness offered


@pytest.mark.parametrize("staleness", [0, 1])
def test_async_grpo_starts_the_next_steps_sessions_before_this_step_trains(staleness: int) -> None:
    """The schedule alone (the sessions and the trainer are stand-ins that log what they do): with staleness 1,
    collecting step n+1 is under way while step n trains and syncs; with 0 it starts only after the sync."""
    log: list[str] = []
    lock, started = threading.Lock(), {n: threading.Event() for n in range(3)}

    def collect(tasks: list[Any]) -> Collected:
        with lock:
            log.append(f"collect {tasks[0]}")
        started[tasks[0]].set()
        return Collected(done=[], version=tasks[0], s=0.0)

    def train(step: int, tasks: list[Any], collected: Collected, wait_s: float) -> HarnessStep:
        if staleness and step < 2:
            assert started[step + 1].wait(timeout=30), "the next step's sessions did not start before training"
        with lock:
            log.append(f"train {step}")
        stats = PhaseStats.of([])
        return HarnessStep(
            step=step, policy_version=collected.version, rollouts=stats, groups_with_signal=0, trainer={}, sessions=[],
            rollout_s=0.0, wait_s=wait_s, train_s=0.0, sync_s=0.0,
        )  # fmt: skip

    steps = list(pipelined([[0], [1], [2]], collect, train, staleness))
    # the engine's busy share is the union of the calls' spans inside the window: overlaps count once
    assert busy_fraction([(1.0, 3.0), (2.0, 4.0), (6.0, 7.0), (-1.0, 0.5)], 0.0, 10.0) == pytest.approx(0.45)
    assert [s.policy_version for s in steps] == [0, 1, 2]
    if staleness:
        assert log == ["collect 0", "collect 1", "train 0", "collect 2", "train 1", "train 2"]
    else:
        assert log == ["collect 0", "train 0", "collect 1", "train 1", "collect 2", "train 2"]


def test_the_teachers_session_through_the_gym_path_is_the_row_the_trainer_gets(
    proxy: ProxyHandle, tmp_path: Path
) -> None:
    """One lookup task, the teacher's script through Pi by the Gym agent's episode path: resolved, its protocol
    counted (two valid tool calls of three calls), and the trainer's row, built as NeMo-RL builds a sample from the
    Gym result, is the session's prefix-merged main chain token for token."""
    (task,) = write_task_repo(tmp_path / "lookup", seed=1, train=1, held_out=0)["train"]
    rollouts = HarnessRollouts(
        "polar_pi", proxy.client(), tmp_path / "sessions", concurrency=1, timeout=300, session={}
    )
    try:
        (done,) = rollouts.run([task], 1, scripted=True)
    finally:
        rollouts.close()
    assert (done.stats.reward, done.stats.masked) == (1.0, False)
    assert (done.stats.calls, done.stats.tool_calls, done.stats.valid_tool_calls) == (3, 2, 2)
    assert done.sample is not None
    row = trainer_row(done.sample, 1.0)
    (session_dir,) = (tmp_path / "sessions" / "teacher").iterdir()
    main_chain = prefix_merging(AttemptDir(session_dir).read_records()).traces[0]
    assert row["input_ids"] == main_chain.prompt_ids + main_chain.response_ids
    assert row["token_mask"] == [0] * len(main_chain.prompt_ids) + main_chain.loss_mask
    assert done.stats.generated_tokens == sum(main_chain.loss_mask)


# Run in the engine virtualenv: the gradient of a weighted sum of the trainable tokens' logprobs, through the
# trainer's harness-size forward (shared prefix once, logits at trainable positions) and through the plain forward of
# each row alone; and the SFT step lowering its rows' loss.
FORWARD_CHECK = r"""
import importlib.util, json, sys, tempfile, torch
spec = importlib.util.spec_from_file_location("w", sys.argv[1]); w = importlib.util.module_from_spec(spec)
spec.loader.exec_module(w)
torch.manual_seed(0)
trainer = w.Trainer(model_dir=sys.argv[2], lr=1e-3, seed=0, loss={})
model = trainer.model
prefix = list(range(5, 45))
rows = []
for k in range(3):
    tail = [100 + 7 * k + i for i in range(10 + 5 * k)]
    mask = [0] * len(prefix) + [0, 0] + [1] * (len(tail) - 4) + [0, 1]
    rows.append({"input_ids": prefix + tail, "token_mask": mask})
def gradient():
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
# Two micro-batches over one prefix computed once: each backward accumulates into it, then its own backward.
model.zero_grad()
prefix = w.SharedPrefix(model, rows, torch.device("cpu"))
selected, offset = 0, 1
for mb in (rows[:2], rows[2:]):
    out = w.trainable_logprobs(model, mb, torch.device("cpu"), prefix)
    n = len(out["logprobs"])
    (out["logprobs"] * torch.arange(offset, offset + n, dtype=torch.float32)).sum().backward()
    selected, offset = selected + n, offset + n
prefix.backward()
ours = gradient()
weights = torch.arange(1, selected + 1, dtype=torch.float32)
plain = []
for r in rows:
    ids = torch.tensor([r["input_ids"]])
    lp = w.token_logprobs(model, ids, torch.ones_like(ids))[0]
    plain.append(lp[torch.tensor(r["token_mask"][1:]).bool()])
model.zero_grad()
(torch.cat(plain) * weights).sum().backward()
reference = gradient()
batch = tempfile.mktemp(suffix=".jsonl")
with open(batch, "w") as fh:
    for r in rows:
        extra = {"generation_logprobs": [0.0] * len(r["input_ids"]), "advantage": 0.0, "sample_mask": 1}
        fh.write(json.dumps({**r, **extra}) + "\n")
first = trainer.sft_step(batch, tempfile.mkdtemp())
second = trainer.sft_step(batch, tempfile.mkdtemp())
print(json.dumps({
    "prefix": prefix.length, "selected": selected, "trainable": sum(sum(r["token_mask"][1:]) for r in rows),
    "max_diff": float((ours - reference).abs().max()), "scale": float(reference.abs().max()),
    "sft_losses": [first["loss"], second["loss"]], "sft_prefix": first["shared_prefix_tokens"],
}))
"""


def test_the_trainers_harness_forward_gives_the_plain_forwards_gradient() -> None:
    python = engine_python()
    if not python.exists():
        pytest.skip("engine virtualenv not built: run `make setup`")
    model = str(resolve_model("tiny-qwen3")[0])
    done = subprocess.run(
        [str(python), "-c", FORWARD_CHECK, str(WORKER), model], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["prefix"] == 40 and out["selected"] == out["trainable"]  # the 40 shared tokens, then trained ones only
    assert out["max_diff"] <= 1e-4 * out["scale"], out
    assert out["sft_prefix"] == 40 and out["sft_losses"][1] < out["sft_losses"][0]


def test_polar_learn_harness_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    for argv, words in ((["--harness", "nope"], "unknown harness"), (["--harness", "pi", "--steps", "-1"], "steps")):
        with pytest.raises(SystemExit) as exc:
            main(["learn", "-o", str(tmp_path), *argv])
        message = str(exc.value)
        assert message.startswith("polar learn:") and words in message and "Traceback" not in message
    assert not any(tmp_path.iterdir())
    assert HarnessLearnConfig().harness == "pi"
