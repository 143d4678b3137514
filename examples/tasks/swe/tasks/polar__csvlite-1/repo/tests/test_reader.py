import pytest

from csvlite import parse_line, read_records


def test_parse_line_quoted_fields():
    assert parse_line('a,"b,c",d') == ["a", "b,c", "d"]
    assert parse_line('"say ""hi""",x') == ['say "hi"', "x"]


def test_parse_line_unterminated_quote():
    with pytest.raises(ValueError):
        parse_line('a,"b')


def test_read_records(tmp_path):
    path = tmp_path / "people.csv"
    path.write_text("name,city\nZoë,Málaga\n\nBo,Oslo\n", encoding="utf-8")
    assert read_records(path) == [{"name": "Zoë", "city": "Málaga"}, {"name": "Bo", "city": "Oslo"}]
