import re

from globmatch import translate


def test_translate_escapes_literal_characters():
    assert re.fullmatch(translate("a+b.(1).txt"), "a+b.(1).txt")
    assert not re.fullmatch(translate("a+b.(1).txt"), "aab.(1).txt")
