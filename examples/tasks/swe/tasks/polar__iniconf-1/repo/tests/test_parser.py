import pytest

from iniconf import ParseError, parse


def test_parse_sections_and_comments():
    text = "# settings\n[server]\nHost = example.org\nport= 8080\n; done\n"
    assert parse(text) == {"server": {"host": "example.org", "port": "8080"}}


def test_value_may_contain_equals_sign():
    assert parse("[db]\nurl = a=b\n") == {"db": {"url": "a=b"}}


def test_error_reports_line_number():
    with pytest.raises(ParseError, match="line 3"):
        parse("[a]\nx = 1\nnot a pair\n")
