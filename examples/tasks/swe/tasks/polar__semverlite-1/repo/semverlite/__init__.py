"""Parse, compare and sort semantic versions (https://semver.org)."""

from semverlite.compare import compare, sort_versions
from semverlite.version import Version, parse

__all__ = ["Version", "compare", "parse", "sort_versions"]
