from globmatch import filter_paths, match, match_any


def test_question_mark_matches_one_character():
    assert match("log1.txt", "log?.txt")
    assert not match("log.txt", "log?.txt")


def test_double_star_matches_any_depth():
    assert match("src/pkg/mod.py", "**/*.py")
    assert match("mod.py", "**/*.py")
    assert not match("src/mod.txt", "**/*.py")


def test_character_classes():
    assert match("file7.txt", "file[0-9].txt")
    assert not match("filex.txt", "file[0-9].txt")
    assert match("b.txt", "[!a].txt")


def test_filter_keeps_order_and_match_any():
    assert filter_paths(["b.py", "a.txt", "a.py"], "*.py") == ["b.py", "a.py"]
    assert match_any("docs/index.md", ["*.py", "docs/*"])
