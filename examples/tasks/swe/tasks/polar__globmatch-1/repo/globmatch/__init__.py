"""Shell-style path matching with ``*``, ``?``, ``[...]`` and ``**``."""

from globmatch.match import filter_paths, match, match_any
from globmatch.translate import translate

__all__ = ["filter_paths", "match", "match_any", "translate"]
