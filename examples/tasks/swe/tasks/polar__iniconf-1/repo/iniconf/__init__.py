"""A small INI reader with named profiles."""

from iniconf.parser import ParseError, parse
from iniconf.profiles import get_profile, profiles

__all__ = ["ParseError", "get_profile", "parse", "profiles"]
