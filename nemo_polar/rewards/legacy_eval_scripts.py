"""Eval scripts for legacy rows, written by a pre-5.0 swebench's own spec tables. Runs in its own tool venv.

Not imported by nemo_polar (it imports only that swebench): :mod:`nemo_polar.rewards.legacy` runs it as
``python -I legacy_eval_scripts.py`` with JSON ``{"rows": [...], "specs": {repo: {version: spec}}}`` on stdin and
reads ``{"swebench": version, "results": [...]}`` from stdout, one result per row: its ``eval_script``,
``log_parser`` and ``eval_type``, or an ``error``.

The script is the one swebench's ``TestSpec.eval_script`` would hold (swebench 4.1.0,
``harness/test_spec/test_spec.py`` ``eval_script`` over ``create_scripts.make_eval_script_list``); ``make_test_spec``
itself is not called because it also builds the environment scripts, which fetch requirement files over the
network. ``specs`` extend swebench's tables (``MAP_REPO_VERSION_TO_SPECS``) for repositories they lack, e.g.
SWE-Gym's; a spec may also name the ``log_parser`` and ``eval_type``.
"""

from __future__ import annotations

import json
import sys


def _make_eval_script_list():
    try:  # swebench 3.x / 4.x
        from swebench.harness.test_spec.create_scripts import make_eval_script_list
    except ImportError:  # swebench 2.x and its forks (SWE-Gym's harness is one)
        from swebench.harness.test_spec import make_eval_script_list
    return make_eval_script_list


def main() -> int:
    import swebench
    from swebench.harness import constants
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    request = json.load(sys.stdin)
    make_eval_script_list = _make_eval_script_list()
    tables = constants.MAP_REPO_VERSION_TO_SPECS
    extensions = getattr(constants, "MAP_REPO_TO_EXT", None)  # 3.x+: which language's script writer
    fail_only = set(getattr(constants, "FAIL_ONLY_REPOS", ()))
    for repo, versions in request.get("specs", {}).items():
        tables.setdefault(repo, {}).update(versions)  # in place: swebench's writers read these same dicts
        if extensions is not None:
            extensions.setdefault(repo, "py")
    results = []
    for row in request["rows"]:
        repo, version = row["repo"], row["version"]
        spec = tables.get(repo, {}).get(version)
        if spec is None:
            known = ", ".join(sorted(tables.get(repo, {}))) or "none"
            results.append(
                {
                    "error": f"swebench {swebench.__version__} has no spec for {repo} {version} "
                    f"(versions it knows for {repo}: {known}); give one with --specs"
                }
            )
            continue
        parser = spec.get("log_parser") or (MAP_REPO_TO_PARSER[repo].__name__ if repo in MAP_REPO_TO_PARSER else None)
        if parser is None:
            results.append(
                {
                    "error": f"swebench {swebench.__version__} has no log parser for {repo}; "
                    "name one (log_parser) in --specs"
                }
            )
            continue
        lines = make_eval_script_list(row, spec, "testbed", "/testbed", row["base_commit"], row["test_patch"])
        results.append(
            {
                "eval_script": "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n",
                "log_parser": parser,
                "eval_type": spec.get("eval_type") or ("fail_only" if repo in fail_only else "pass_and_fail"),
            }
        )
    json.dump({"swebench": swebench.__version__, "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
