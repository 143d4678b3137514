"""Layered configuration dictionaries: deep merging and dotted-path access."""

from confmerge.merge import deep_merge, layered
from confmerge.paths import flatten, get_path, with_value

__all__ = ["deep_merge", "flatten", "get_path", "layered", "with_value"]
