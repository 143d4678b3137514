"""The suite's own rules (docs/testing.md): test modules import no other test module, what they share lives in
tests/helpers or conftest, and every test the claims table names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DOCS = TESTS.parent / "docs" / "testing.md"


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_test_module_imports_another() -> None:
    offenders = {
        path.name: sorted(m for m in _imported(path) if re.match(r"tests\.test_|test_", m))
        for path in sorted(TESTS.rglob("*.py"))
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_claims_table_names_tests_that_exist() -> None:
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", DOCS.read_text())
    assert len(named) >= 20
    missing = [
        f"{module}::{test}"
        for module, test in named
        if not re.search(rf"^(async )?def {test}\(", (TESTS / module).read_text(), re.MULTILINE)
    ]
    assert missing == []
