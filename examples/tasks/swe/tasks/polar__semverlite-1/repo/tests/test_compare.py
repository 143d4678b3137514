from semverlite import compare, sort_versions


def test_core_parts_compare_numerically():
    assert compare("1.10.0", "1.9.0") == 1
    assert compare("2.0.0", "2.0.0+build.7") == 0


def test_prerelease_identifiers():
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11"]
    assert [str(v) for v in sort_versions(reversed(ordered))] == ordered
