"""One verdict per episode: the kind is decided by what happened (session status, grade, reconstruction, policy
versions), in that order of trust, and NeMo Gym's failure kind follows from it. The same cases the gateway's
metrics label and the Gym agent report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_polar.env.runtime.session import SessionResult
from nemo_polar.env.runtime.verdict import GYM_FAILURE_KINDS, Verdict, VerdictPolicy, judge
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.rewards.grader import GradeResult
from tests.helpers.records import EOT, child, rec


def session(status: str = "completed", **kw: Any) -> SessionResult:
    fields: dict[str, Any] = {
        "session_id": "s", "harness": "pi", "harness_version": "0", "runtime": "local", "instance_id": "i",
        "status": status, "exit_code": 0, "session_dir": Path("/nonexistent"), "error": kw.pop("error", None),
    }  # fmt: skip
    return SessionResult(**fields, **kw)


def graded(status: str = "resolved", mask: bool = False) -> GradeResult:
    reward = 1.0 if status == "resolved" else 0.0
    return GradeResult(instance_id="i", reward=reward, resolved=status == "resolved", status=status, mask_sample=mask)  # type: ignore[arg-type]


def verdict_of(
    status: str = "completed", grade: GradeResult | None = None, versions: tuple[int, ...] = (1,), **policy: Any
) -> Verdict:
    first = rec("a", [1, 2], [10, EOT], policy_version=versions[0])
    records = [first, child("b", first, [5], [11, EOT], policy_version=versions[-1])]
    build = prefix_merging(records)
    main = [t for t in build.traces if t.role == "main"]
    return judge(session(status, error="boom"), grade, build, main, VerdictPolicy(**policy))


@pytest.mark.parametrize(
    ("verdict", "kind", "gym"),
    [
        (lambda: verdict_of(grade=graded()), "trainable", None),
        (lambda: verdict_of(grade=graded("unresolved")), "trainable", None),
        (lambda: verdict_of("timeout"), "timeout", "agent_timeout"),
        (lambda: verdict_of("harness_error"), "harness_error", "agent_run_error"),
        (lambda: verdict_of("proxy_unreachable"), "proxy_unreachable", "transport_unreachable"),
        (lambda: verdict_of(grade=None), "evaluation_failed", "verifier_error"),
        (lambda: verdict_of(grade=graded("infra_failure", True)), "grade_infra_failure", "polar:grade_infra_failure"),
        (lambda: verdict_of(grade=graded("tests_timeout", True)), "grade_tests_timeout", "polar:grade_tests_timeout"),
        (lambda: verdict_of(grade=graded(), versions=(1, 2)), "trainable", None),  # keep: importance-correct
        (
            lambda: verdict_of(grade=graded(), versions=(1, 2), cross_version="mask"),
            "cross_version",
            "polar:cross_version",
        ),
    ],
)
def test_the_verdict_kind_follows_from_what_happened(verdict: Any, kind: str, gym: str | None) -> None:
    v = verdict()
    assert v.kind == kind and v.trainable == (kind == "trainable") and v.mask_sample == (kind != "trainable")
    assert v.gym_failure_kind == gym
    if not v.trainable:
        assert v.reason  # people get the details; groups use the kind


def test_a_session_failure_outranks_the_grade_and_the_tokens() -> None:
    v = verdict_of("timeout", grade=graded())
    assert v.kind == "timeout" and "boom" in (v.reason or "") and v.reward is None


def test_on_timeout_grade_trains_on_the_workspace_a_timed_out_session_left() -> None:
    """SWE-agent's autosubmission: the patch a looping session left is graded, and the reason says it timed out."""
    v = verdict_of("timeout", grade=graded(), on_timeout="grade")
    assert (v.kind, v.reward) == ("trainable", 1.0) and "timed out" in (v.reason or "") and "boom" in (v.reason or "")
    assert verdict_of("timeout", grade=None, on_timeout="grade").kind == "evaluation_failed"
    # only a timeout is graded as left: a harness that failed stays masked whatever the grade
    assert verdict_of("harness_error", grade=graded(), on_timeout="grade").kind == "harness_error"
    assert VerdictPolicy(on_timeout="grade").grades(session("timeout"))
    assert not VerdictPolicy().grades(session("timeout"))


def test_no_main_chain_and_a_broken_one() -> None:
    empty = judge(session(), graded(), prefix_merging([]), [], VerdictPolicy())
    assert (empty.kind, empty.reward) == ("no_main_chain", 1.0)  # graded, but nothing to train on

    first = rec("a", [1, 2], [10, EOT])
    build = prefix_merging([first])
    [main] = build.traces
    second = main.model_copy(update={"segment": 1, "break_reason": "sampling_changed"})
    kept = judge(session(), graded(), build, [main, second], VerdictPolicy())
    masked = judge(session(), graded(), build, [main, second], VerdictPolicy(mask_main_chain_breaks=True))
    assert kept.kind == "trainable"
    assert masked.kind == "main_chain_broken" and "sampling_changed" in (masked.reason or "")


def test_every_gym_failure_kind_is_registered_or_namespaced() -> None:
    """nemo-gym 0.7.0's own check (nemo_gym/failure_kinds.py): a name is in its vocabulary or ``<server>:<kind>``."""
    from typing import get_args

    failure_kinds = pytest.importorskip("nemo_gym.failure_kinds")
    from nemo_polar.env.runtime.verdict import VerdictKind

    for kind in get_args(VerdictKind):
        name = Verdict(kind=kind).gym_failure_kind
        if kind == "trainable":
            assert name is None
            continue
        assert failure_kinds.is_registered(name) or failure_kinds.is_namespaced(name), name
    assert all(failure_kinds.is_registered(n) for n in GYM_FAILURE_KINDS.values())
