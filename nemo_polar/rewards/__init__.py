"""SWE-Bench rewards: instances, the official grader in a fresh sandbox, bundled tasks."""

from nemo_polar.rewards.datasets import load_instances
from nemo_polar.rewards.grader import Evaluator, GradeResult, grade
from nemo_polar.rewards.instance import SWEInstance, bundled_instances

__all__ = ["Evaluator", "GradeResult", "SWEInstance", "bundled_instances", "grade", "load_instances"]
