"""Legacy rows (SWE-Gym, SWE-bench exports before 5.0) converted once into rows as SWE-bench 5 publishes them.

A legacy row has no ``eval_script``, ``log_parser`` or ``image``: swebench up to 4.x wrote the script from per-repo
spec tables that 5.0 dropped. ``polar convert-rows`` runs those tables where they still live: a pre-5.0 swebench
(``swebench==4.1.0`` by default, or any requirement, e.g. a fork with more repositories) in a tool venv of its own
under ``$POLAR_CACHE/envs``, built once with ``uv``. Repositories the tables lack get their spec from ``--specs``
(YAML, swebench's spec keys). The image is named by a template; the result is validated as an instance before
anything is written, and nothing is written when any row fails.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from nemo_polar.paths import cache_dir
from nemo_polar.rewards.instance import SWEInstance, read_rows
from nemo_polar.rewards.testlog import repo_parser_names

LEGACY_SWEBENCH = "swebench==4.1.0"
REQUIRED = ("instance_id", "repo", "version", "base_commit", "test_patch")

# Image names as the projects publish them (the registry's default host is implied):
#  - swebench: TestSpec.instance_image_key with a namespace (swebench 4.1.0 harness/test_spec/test_spec.py):
#    "__" -> "_1776_", lower case;
#  - swe-gym: OpenHands' evaluation/benchmarks/swe_bench/run_infer.py get_instance_docker_image for SWE-Gym:
#    "__" -> "_s_", lower case.
IMAGE_PRESETS = {
    "swebench": "swebench/sweb.eval.x86_64.{id_1776}:latest",
    "swe-gym": "xingyaoww/sweb.eval.x86_64.{id_s}:latest",
}
TOOL = Path(__file__).with_name("legacy_eval_scripts.py")


class LegacySpec(BaseModel):
    """One repo/version's spec, with swebench's keys (only these shape the eval script); others are kept."""

    model_config = ConfigDict(extra="allow")
    test_cmd: str
    install: str | None = None
    eval_commands: list[str] | None = None
    log_parser: str | None = None
    eval_type: str | None = None


def image_name(template: str, instance_id: str) -> str:
    """The row's image from a preset (``swebench``, ``swe-gym``) or a template with ``{instance_id}``,
    ``{id_1776}`` or ``{id_s}``."""
    preset = IMAGE_PRESETS.get(template)
    fields = {
        "instance_id": instance_id,
        "id_1776": instance_id.replace("__", "_1776_"),
        "id_s": instance_id.replace("__", "_s_"),
    }
    if preset is None and "{" not in template:
        raise ValueError(f"--image {template!r}: not a preset ({', '.join(IMAGE_PRESETS)}) nor a template with a field")
    try:
        name = (preset or template).format(**fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"--image {template!r}: not a preset ({', '.join(IMAGE_PRESETS)}) nor a template using "
            f"{{{'}, {'.join(fields)}}} ({exc!r})"
        ) from None
    return name.lower() if preset else name


def load_specs(path: Path | None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{repo: {version: spec}}`` from YAML; versions are strings, as in SWE-bench ("3.0", never 3.0)."""
    if path is None:
        return {}
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--specs {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--specs {path}: expected {{repo: {{version: spec}}}}")
    specs: dict[str, dict[str, dict[str, Any]]] = {}
    for repo, versions in raw.items():
        if not isinstance(versions, dict):
            raise ValueError(f"--specs {path}: {repo}: expected {{version: spec}}")
        for version, spec in versions.items():
            if not isinstance(version, str):
                raise ValueError(f"--specs {path}: {repo}: version {version!r} must be a quoted string")
            try:
                specs.setdefault(repo, {})[version] = LegacySpec.model_validate(spec).model_dump(exclude_none=True)
            except ValidationError as exc:
                raise ValueError(f"--specs {path}: {repo} {version}: {exc}") from None
    return specs


def tool_python(requirement: str = LEGACY_SWEBENCH) -> Path:
    """The tool venv's interpreter for ``requirement``, built once (locked: concurrent runs share it)."""
    from uv import find_uv_bin

    root = cache_dir() / "envs" / f"swebench-legacy-{hashlib.sha256(requirement.encode()).hexdigest()[:12]}"
    python = root / "bin" / "python"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / ".installed").exists():
            return python
        uv = find_uv_bin()
        print(f"building the legacy-spec tool venv ({requirement}) in {root}", file=sys.stderr)
        for cmd in (
            [uv, "venv", "--quiet", "--clear", "--python", sys.executable, str(root)],
            [uv, "pip", "install", "--quiet", "--python", str(python), requirement],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "VIRTUAL_ENV": str(root)})
            if done.returncode != 0:
                raise ValueError(f"cannot build the tool venv for {requirement}: {done.stderr.strip()[-2000:]}")
        (root / ".installed").write_text(requirement + "\n")
    return python


def current_parser_name(repo: str, parser: str) -> str:
    """The name swebench 5 gives ``repo``'s parser where it is the same function as ``parser``. swebench 4.x
    names a repository's parser by its function (``parse_log_pytest_options`` for psf/requests); swebench 5's
    rows by its table's alias (``parse_log_requests``). Either grades alike; a row should read as 5 publishes it."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    current = repo_parser_names().get(repo)
    if current is not None and PARSER_REGISTRY.get(current) is PARSER_REGISTRY.get(parser):
        return current
    return parser


def _checked(where: str, row: dict[str, Any]) -> dict[str, Any]:
    missing = [k for k in REQUIRED if not row.get(k)]
    if missing:
        raise ValueError(f"{where}: a legacy row needs {', '.join(missing)}")
    if not isinstance(row["version"], str):
        raise ValueError(f"{where}: version {row['version']!r} must be a string, as SWE-bench publishes it")
    return row


def convert(
    rows: list[tuple[str, dict[str, Any]]],
    image: str,
    specs: dict[str, dict[str, dict[str, Any]]] | None = None,
    requirement: str = LEGACY_SWEBENCH,
) -> list[dict[str, Any]]:
    """Each row with its ``eval_script``, ``log_parser``, ``eval_type`` and ``image``. Rows that already have an
    eval script keep it (and their image, if any). Every result is checked as a :class:`SWEInstance`."""
    legacy = [(where, _checked(where, row)) for where, row in rows if not row.get("eval_script")]
    written: list[dict[str, Any]] = []
    if legacy:
        request = {"rows": [row for _, row in legacy], "specs": specs or {}}
        done = subprocess.run(
            [str(tool_python(requirement)), "-I", str(TOOL)],
            input=json.dumps(request, default=str),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise ValueError(f"{requirement} could not write the eval scripts: {done.stderr.strip()[-2000:]}")
        written = json.loads(done.stdout)["results"]
    by_where = {where: result for (where, _), result in zip(legacy, written, strict=True)}
    out = []
    for where, row in rows:
        result = by_where.get(where, {})
        if "error" in result:
            raise ValueError(f"{where} ({row['instance_id']}): {result['error']}")
        converted = {**row, **result}
        converted["log_parser"] = current_parser_name(row["repo"], converted["log_parser"])
        converted["image"] = row.get("image") or image_name(image, row["instance_id"])
        try:
            SWEInstance.model_validate(converted)
        except ValidationError as exc:
            raise ValueError(f"{where}: the converted row is not a valid instance: {exc}") from None
        out.append(converted)
    return out


def convert_file(
    source: Path, output: Path, image: str, specs: Path | None = None, requirement: str = LEGACY_SWEBENCH
) -> list[dict[str, Any]]:
    """:func:`convert` from anything :func:`read_rows` reads to JSONL, written whole or not at all."""
    rows = convert(read_rows(source), image, load_specs(specs), requirement)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, default=str) + "\n")
    tmp.replace(output)
    return rows
