"""NeMo Gym's SWE rows, in each shape Gym's own SWE agents take, read as SWE-bench instances.

Three shapes carry the same thing (read from NVIDIA-NeMo/Gym at 07d6b0d, ``responses_api_agents/``):

- **polar** (this project's example rows): the SWE-bench fields at the top level beside ``responses_create_params``.
- **swe_agents** (``swe_agents/data/example.jsonl``): the same top-level fields, and in
  ``responses_create_params.metadata`` the instance id, ``base_commit``, ``golden_patch``, ``dataset_name``,
  ``split`` and ``instance_dict``.
- **anyswe** / harness-agent (``anyswe_agent/data/example.jsonl``): ``input: []`` and everything in ``metadata``:
  ``instance_id``, ``problem_statement``, ``dataset_name``, ``split`` and ``instance_dict``, the whole SWE-bench
  row as a JSON string (``anyswe_agent/app.py::_instance_dict``); an image may be named by ``metadata.image`` or the
  instance's ``image`` / ``docker_image`` (``_sandbox_image``).

Top-level fields win over ``instance_dict``, which wins over ``metadata``'s own; two sources that disagree on the
instance id are an error. The task text is the user text of ``input``, else the row's ``problem_statement``.

Where the environment comes from, first found: the row's image; a ``container_formatter`` (Gym's agent config:
a template, or a list of them, with ``{instance_id}``; see :func:`container_for`); the row's ``repo_path``; the
bundled instance with the row's id. A row with an image but no ``eval_script`` (a SWE-bench row before 5.0, as Gym
ships them) gets its eval script from swebench's own spec tables (:mod:`nemo_polar.rewards.legacy`), never a
generic test command: that would grade a Django or SymPy instance by the wrong runner. Every error is one line
naming the row and the field. Nothing here imports nemo-gym.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nemo_polar.rewards.instance import SWEInstance, bundled_instances

INSTANCE_FIELDS = frozenset(SWEInstance.model_fields)
# What a row must say about the task itself; the environment may come from a bundled instance.
REQUIRED_WITHOUT_BUNDLE = ("repo", "FAIL_TO_PASS")
PATH_FIELDS = ("repo_path", "python_env")
# metadata key -> instance field (swe_agents rows name the gold patch golden_patch)
METADATA_FIELDS = {
    "instance_id": "instance_id",
    "problem_statement": "problem_statement",
    "base_commit": "base_commit",
    "golden_patch": "patch",
    "image": "image",
    "docker_image": "image",
}
# Image names in SWE-bench's registry spell "__" as "_1776_" (swebench harness/test_spec: instance_image_key),
# SWE-Gym's as "_s_" (the candidates of Gym's swe_agents/app.py::_find_container).
ID_SPELLINGS = ("_1776_", "_s_")
Formatter = str | Sequence[str]


class RowError(ValueError):
    """A row that cannot run; the message names the row and the field."""


def is_gym_row(row: Mapping[str, Any]) -> bool:
    return "responses_create_params" in row


def instruction(params: Mapping[str, Any]) -> str:
    """The user text of ``responses_create_params``: ``input`` as a string, or the text of its user messages
    (``instructions``, if any, first); "" when it has none."""
    raw = params.get("input")
    texts: list[str] = []
    if isinstance(raw, str):
        texts.append(raw)
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, Mapping) and item.get("role") == "user":
                texts.append(_content_text(item.get("content")))
    text = "\n\n".join(t for t in texts if t.strip())
    if not text.strip():
        return ""
    head = params.get("instructions")
    return f"{head}\n\n{text}" if isinstance(head, str) and head.strip() else text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") in ("input_text", "text", "output_text")
        )
    return ""


def validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}" for e in exc.errors())


def swe_fields(row: Mapping[str, Any], where: str = "row") -> dict[str, Any]:
    """The SWE-bench fields of a row of any shape, merged (top level > instance_dict > metadata)."""
    params = row.get("responses_create_params")
    metadata = params.get("metadata") if isinstance(params, Mapping) else None
    metadata = metadata if isinstance(metadata, Mapping) else {}
    from_meta = {field: metadata[key] for key, field in METADATA_FIELDS.items() if metadata.get(key) is not None}
    raw = metadata.get("instance_dict")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RowError(f"{where}: metadata.instance_dict is not JSON: {exc}") from None
    if raw is not None and not isinstance(raw, Mapping):
        raise RowError(f"{where}: metadata.instance_dict must be an object (or its JSON), got {type(raw).__name__}")
    inner = {k: v for k, v in (raw or {}).items() if v is not None}
    if "image" not in inner and inner.get("docker_image"):
        inner["image"] = inner["docker_image"]
    top = {k: v for k, v in row.items() if k in INSTANCE_FIELDS and v is not None}
    sources = {"": top, "metadata.instance_dict.": inner, "metadata.": from_meta}
    ids = {src: d["instance_id"] for src, d in sources.items() if d.get("instance_id") is not None}
    if len(set(map(str, ids.values()))) > 1:
        named = ", ".join(f"{src}instance_id={i!r}" for src, i in ids.items())
        raise RowError(f"{where}: the row names two instances: {named}")
    fields = {**from_meta, **{k: v for k, v in inner.items() if k in INSTANCE_FIELDS}, **top}
    if isinstance(fields.get("image"), str):
        fields["image"] = fields["image"].removeprefix("docker://")  # a name: the local daemon first, then a registry
    return fields


def container_for(formatter: Formatter, instance_id: str) -> str | None:
    """The image a ``container_formatter`` names for ``instance_id``, as Gym's SWE agents find it (Gym 07d6b0d):

    - a path template (``/sif/sweb.eval.x86_64.{instance_id}.sif``): the first existing file for the id as it is,
      then with ``__`` as ``_1776_`` and as ``_s_`` (each as written, then lower case), then any ``*<id>*.sif`` in
      the template's directory (``swe_agents/app.py::_find_container``); None when none exists;
    - an image template (``docker://swebench/sweb.eval.x86_64.{instance_id}``): the id with ``__`` as ``_1776_``,
      lower case, ``:latest`` when untagged (``anyswe_agent/app.py::_sandbox_image``).

    A list is tried in order; the first template that names an existing file, or the first image template, wins."""
    templates = [formatter] if isinstance(formatter, str) else list(formatter)
    candidates = [instance_id]
    for spelling in ID_SPELLINGS:
        candidates += [instance_id.replace("__", spelling), instance_id.replace("__", spelling).lower()]
    for template in templates:
        if not _is_path(template):
            image = template.removeprefix("docker://").format(instance_id=instance_id.replace("__", "_1776_").lower())
            return image if ":" in image.rsplit("/", 1)[-1] else f"{image}:latest"
        for candidate in candidates:
            if os.path.isfile(path := template.format(instance_id=candidate)):
                return path
        folder = os.path.dirname(template.format(instance_id=candidates[1]))
        for term in dict.fromkeys([instance_id, instance_id.lower(), *candidates]):
            if matches := sorted(glob.glob(os.path.join(glob.escape(folder), f"*{glob.escape(term)}*.sif"))):
                return matches[0]
    return None


def _is_path(template: str) -> bool:
    return template.startswith(("/", "./", "../")) or template.endswith(".sif")


def instance_from_row(
    row: Mapping[str, Any],
    task_text: str | None = None,
    *,
    container_formatter: Formatter | None = None,
    where: str | None = None,
) -> SWEInstance:
    """The instance a row of any shape describes; ``task_text`` (default: the row's user text, else its problem
    statement) becomes its problem statement. Raises :class:`RowError`."""
    fields = swe_fields(row, where or "row")
    instance_id = fields.get("instance_id")
    if not isinstance(instance_id, str) or not instance_id:
        raise RowError(f"{where or 'row'}: the row has no instance_id (a SWE-bench instance field)")
    where = where or instance_id
    params = row.get("responses_create_params")
    text = task_text or (instruction(params) if isinstance(params, Mapping) else "")
    for key in PATH_FIELDS:
        if key in fields:
            path = Path(str(fields[key]))
            if not path.is_absolute():
                raise RowError(f"{where}: {key} must be an absolute path, got {fields[key]!r}")
            if not path.exists():
                raise RowError(f"{where}: {key} {path} does not exist on this host")
    if "image" not in fields and container_formatter:
        image = container_for(container_formatter, instance_id)
        if image is None:
            raise RowError(f"{where}: container_formatter {container_formatter!r} names no existing file for it")
        fields["image"] = image
    base: dict[str, Any] = {}
    if "repo_path" not in fields and "image" not in fields:
        bundled = {i.instance_id: i for i in bundled_instances()}
        if instance_id not in bundled:
            raise RowError(
                f"{where}: the row has no image, no repo_path, no container_formatter names one, and {instance_id!r} "
                f"is not a bundled instance (bundled: {', '.join(sorted(bundled))})"
            )
        base = bundled[instance_id].model_dump(exclude_none=True)
    else:
        missing = [k for k in REQUIRED_WITHOUT_BUNDLE if k not in fields]
        if missing:
            raise RowError(f"{where}: missing SWE-bench instance field(s): {', '.join(missing)}")
    merged = {**base, **fields}
    merged["problem_statement"] = text or merged.get("problem_statement") or ""
    if not merged["problem_statement"].strip():
        raise RowError(
            f"{where}: no task text: responses_create_params.input has no user text and the row no problem_statement"
        )
    if merged.get("image") and not merged.get("eval_script") and "test_command" not in fields:
        merged = _with_eval_script(merged, where)
    try:
        return SWEInstance.model_validate(merged)
    except ValidationError as exc:
        raise RowError(f"{where}: not a valid SWE-bench instance: {validation_message(exc)}") from None
    except ValueError as exc:  # e.g. a field validator's JSON error raised outside pydantic's wrapping
        raise RowError(f"{where}: not a valid SWE-bench instance: {exc}") from None


def _with_eval_script(fields: dict[str, Any], where: str) -> dict[str, Any]:
    """A pre-5.0 SWE-bench row (image, no eval script): its eval script, parser and eval type from swebench's spec
    tables, run once per row in the legacy tool's venv."""
    from nemo_polar.rewards.legacy import convert

    try:
        [converted] = convert([(where, fields)], image=fields["image"])
    except ValueError as exc:
        raise RowError(f"{where}: no eval_script, and swebench's spec tables give none: {exc}") from None
    return converted
