"""Check a NeMo-RL GRPO recipe that trains on the Polar environments, before a GPU cluster finds out.

A recipe is loaded the way NeMo-RL loads it (:func:`load_recipe`), its Gym part is merged by nemo-gym's own config
parser the way NeMo-RL's Gym actor starts it, and every Polar agent in it is validated as
:class:`~nemo_polar.env.gym.agent.PolarAgentConfig` together with what NeMo-RL's vLLM HTTP server will accept:
chat-completions requests only, at exactly the trainer's temperature and top_p. The dataset rows must route to
one of those agents. Anything wrong raises :class:`RecipeError` naming the recipe and the problem.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from nemo_polar.env.gym import gym_root
from nemo_polar.env.gym.rows import validation_message
from nemo_polar.env.specs import UnknownEnv, get_env
from nemo_polar.proxy.store.sessions import SessionConfig

# Keys of env.nemo_gym that NeMo-RL consumes itself and never hands to Gym (run_grpo_nemo_gym.py and
# nemo_rl/environments/nemo_gym.py pop them).
NEMO_RL_ONLY_KEYS = frozenset(
    {
        "is_trajectory_collection",
        "invalid_tool_call_patterns",
        "thinking_tags",
        "tokenizer_config",
        "pad_dynamic_image_shapes",
        "effort_levels",
    }
)
# What NeMo-RL's exposed vLLM server serves: /v1/chat/completions and /tokenize, so no continuation mode.
CHAT_MODES = ("chat", "chat_prefix")
# A stand-in for the DP-rank vLLM URLs NeMo-RL injects as Gym's policy_base_url.
PLACEHOLDER_BASE_URLS = ("http://127.0.0.1:8000/v1",)


class RecipeError(ValueError):
    """A recipe that would not train; the message names the recipe and the problem."""


class RecipeAgent(BaseModel):
    instance: str  # the Gym server instance (what dataset rows route to with agent_ref.name)
    env: str
    harness: str
    mode: str
    config_path: Path
    delivery: str = "main_chain"


class RecipeSummary(BaseModel):
    path: Path
    model: str
    training_backend: Literal["megatron", "dtensor"]
    generation_backend: str
    async_grpo: bool
    colocated: bool
    http_server: bool
    group_size: int
    prompts_per_step: int
    multi_trace: bool = False
    agents: list[RecipeAgent]
    data_paths: list[Path]


def _register_resolvers() -> None:
    # NeMo-RL's own resolvers (nemo_rl.utils.config.register_omegaconf_resolvers), so its recipes resolve here.
    for name, fn in {
        "add": lambda a, b: a + b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "max": lambda a, b: max(a, b),
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def _merge(base: DictConfig, override: DictConfig) -> DictConfig:
    """NeMo-RL's merge: a top-level section marked ``_override_: true`` replaces the base's instead of merging,
    and a mandatory ``???`` in the override leaves the base's value."""
    for key in list(override.keys()):
        if OmegaConf.is_missing(override, key):
            continue
        node = override[key]
        if isinstance(node, DictConfig) and node.get("_override_", False):
            node.pop("_override_")
            if key in base:
                base.pop(key)
    merged = OmegaConf.merge(base, override)
    assert isinstance(merged, DictConfig)
    return merged


def load_recipe(path: str | Path) -> DictConfig:
    """Load a recipe with NeMo-RL's inheritance rule (``nemo_rl.utils.config.load_config``): ``defaults`` is one
    path or a list, relative to the file's directory; parents load recursively, merge in order, and the file
    itself merges last."""
    path = Path(path)
    try:
        config = OmegaConf.load(path)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        raise RecipeError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, DictConfig):
        raise RecipeError(f"{path}: a recipe must be a mapping, not a list")
    if "defaults" not in config:
        return config
    defaults = config.pop("defaults")
    parents = [defaults] if isinstance(defaults, str) else list(defaults) if isinstance(defaults, ListConfig) else []
    if not parents:
        raise RecipeError(f"{path}: defaults must be a path or a list of paths, got {defaults!r}")
    base = OmegaConf.create({})
    for parent in parents:
        parent_path = Path(str(parent))
        if not parent_path.is_absolute():
            parent_path = path.parent / parent_path
        if not parent_path.is_file():
            raise RecipeError(f"{path}: defaults names {parent!s}, which is not a file ({parent_path})")
        base = _merge_or_fail(path, base, load_recipe(parent_path))
    return _merge_or_fail(path, base, config)


def _merge_or_fail(path: Path, base: DictConfig, override: DictConfig) -> DictConfig:
    try:
        return _merge(base, override)
    except OmegaConfBaseException as exc:
        # e.g. a top-level scalar interpolating an inherited key: NeMo-RL's merge reads it before merging, too.
        raise RecipeError(f"{path}: does not merge over its defaults: {str(exc).splitlines()[0]}") from None


def resolve_recipe(path: str | Path) -> dict[str, Any]:
    """The recipe as NeMo-RL hands it to its trainer: inherited, interpolated, plain containers."""
    _register_resolvers()
    config = load_recipe(path)
    try:
        resolved = OmegaConf.to_container(config, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        hint = " (export POLAR_GYM_ROOT=$(polar gym-root))" if "POLAR_GYM_ROOT" in str(exc) else ""
        raise RecipeError(f"{path}: does not resolve: {str(exc).splitlines()[0]}{hint}") from None
    assert isinstance(resolved, dict)
    return resolved


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _polar_config_path(entry: str, root: Path) -> Path | None:
    """Where a config_paths entry lives if it names a Polar environment's file, else None (another Gym component,
    which Gym resolves through its own search roots)."""
    if Path(entry).is_absolute():
        try:
            Path(entry).resolve().relative_to(root.resolve())
        except ValueError:
            return None
        return Path(entry)
    candidate = root / entry
    return candidate if candidate.is_file() or entry.startswith("environments/polar_") else None


def check_recipe(
    path: str | Path, *, root: Path | None = None, base_urls: tuple[str, ...] = PLACEHOLDER_BASE_URLS
) -> RecipeSummary:
    """Check a recipe end to end and summarise it; raises :class:`RecipeError` on the first problem."""
    path = Path(path)
    root = root or gym_root()
    config = resolve_recipe(path)

    def need(dotted: str) -> Any:
        try:
            return _get(config, dotted)
        except KeyError:
            raise RecipeError(f"{path}: {dotted} is not set") from None

    if need("env.should_use_nemo_gym") is not True:
        raise RecipeError(f"{path}: env.should_use_nemo_gym must be true for the Polar environments")
    generation = need("policy.generation")
    if generation.get("backend") != "vllm":
        raise RecipeError(
            f"{path}: policy.generation.backend is {generation.get('backend')!r}; the Polar proxy needs NeMo-RL's "
            "vLLM HTTP server (backend: vllm)"
        )
    gym = dict(need("env.nemo_gym"))
    config_paths = gym.get("config_paths")
    if not isinstance(config_paths, list) or not config_paths or not all(isinstance(p, str) for p in config_paths):
        raise RecipeError(f"{path}: env.nemo_gym.config_paths must be a non-empty list of paths")

    polar_paths: dict[str, Path] = {}
    for entry in config_paths:
        located = _polar_config_path(entry, root)
        if located is None:
            continue  # another component's config: Gym resolves it through its own roots
        if not located.is_file():
            raise RecipeError(
                f"{path}: config_paths entry {entry!r} is not in the Polar Gym root {root} (its environments: "
                f"{', '.join(sorted(p.name for p in (root / 'environments').iterdir() if p.is_dir()))})"
            )
        polar_paths[entry] = located
    if not polar_paths:
        raise RecipeError(
            f"{path}: no config_paths entry is a Polar environment (environments/polar_<cli>/config.yaml)"
        )

    agents = list(_agents(path, config, gym, polar_paths, base_urls))
    if not agents:
        raise RecipeError(f"{path}: the Polar environments in config_paths define no polar_agent server")
    data_paths = _check_data(path, config, {a.instance for a in agents})

    megatron = bool(config["policy"].get("megatron_cfg", {}).get("enabled"))
    multi_trace = bool(config["grpo"].get("gym_multi_trace"))
    if multi_trace:
        _check_multi_trace(path, config, megatron, agents)
    vllm_cfg = generation.get("vllm_cfg", {})
    return RecipeSummary(
        path=path,
        model=need("policy.model_name"),
        training_backend="megatron" if megatron else "dtensor",
        generation_backend=generation["backend"],
        async_grpo=bool(config["grpo"].get("async_grpo", {}).get("enabled")),
        colocated=bool(generation.get("colocated", {}).get("enabled")),
        http_server=bool(vllm_cfg.get("async_engine")) and bool(vllm_cfg.get("expose_http_server")),
        multi_trace=multi_trace,
        group_size=need("grpo.num_generations_per_prompt"),
        prompts_per_step=need("grpo.num_prompts_per_step"),
        agents=agents,
        data_paths=data_paths,
    )


def _agents(
    path: Path, config: dict[str, Any], gym: dict[str, Any], polar_paths: dict[str, Path], base_urls: tuple[str, ...]
) -> Iterator[RecipeAgent]:
    """Merge the Gym config with nemo-gym's own parser, as NeMo-RL's Gym actor does, and check each Polar agent."""
    try:
        from nemo_polar.env.gym.agent import PolarAgentConfig
        from nemo_polar.env.gym.compat import GlobalConfigDictParser
    except ImportError as exc:
        raise RecipeError(
            f"checking a recipe's Gym config needs nemo-gym ({exc}); install it with `make gym`"
        ) from None

    initial = {k: v for k, v in gym.items() if k not in NEMO_RL_ONLY_KEYS}
    # Absolute paths: the check must not depend on NEMO_GYM_EXTRA_ROOTS being exported in this shell.
    initial["config_paths"] = [str(polar_paths.get(p, p)) for p in gym["config_paths"]]
    initial |= {
        "policy_model_name": config["policy"]["model_name"],
        "policy_base_url": list(base_urls),
        "policy_api_key": "dummy_key",
    }
    try:
        parsed = GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=DictConfig(initial))
        instances = GlobalConfigDictParser().filter_for_server_instance_configs(parsed)
    except Exception as exc:  # nemo-gym's own errors (missing values, almost-servers, unreadable files)
        raise RecipeError(f"{path}: nemo-gym rejects env.nemo_gym: {exc}") from None

    sources = {name: p for p in polar_paths.values() for name in (OmegaConf.load(p) or {})}
    generation = config["policy"]["generation"]
    for instance in instances:
        server = OmegaConf.to_container(parsed[instance.name], resolve=True)
        agent = (server.get("responses_api_agents") or {}).get("polar_agent") if isinstance(server, dict) else None
        if agent is None:
            continue
        where = f"{path}: Gym agent {instance.name}"
        try:
            env = get_env(agent.get("env", ""))
        except UnknownEnv as exc:
            raise RecipeError(f"{where}: {exc}") from None
        try:
            cfg = PolarAgentConfig.model_validate({**agent, "host": "127.0.0.1", "port": 0, "name": instance.name})
        except ValidationError as exc:
            raise RecipeError(f"{where}: not a valid Polar agent config: {validation_message(exc)}") from None
        try:  # the agent's session config merges over the env's, key by key (PolarAgent._plan)
            session = SessionConfig.model_validate({**env.session, **cfg.session})
        except ValidationError as exc:
            raise RecipeError(f"{where}: invalid proxy session config: {validation_message(exc)}") from None
        if session.mode not in CHAT_MODES:
            raise RecipeError(
                f"{where}: session mode {session.mode!r} needs /v1/completions, which NeMo-RL's vLLM server does "
                f"not serve; set session.mode to one of {', '.join(CHAT_MODES)}"
            )
        pinned = session.sampling_overrides
        for name in ("temperature", "top_p"):
            want = generation.get(name)
            if getattr(pinned, name) != want:
                raise RecipeError(
                    f"{where}: session.sampling_overrides.{name} is {getattr(pinned, name)!r} but "
                    f"policy.generation.{name} is {want!r}; NeMo-RL's vLLM server refuses requests that do not "
                    "sample with the trainer's settings"
                )
        if pinned.top_k not in (None, -1):
            raise RecipeError(f"{where}: NeMo-RL's vLLM server accepts only an unset top_k, got {pinned.top_k}")
        yield RecipeAgent(
            instance=instance.name,
            env=env.name,
            harness=cfg.harness or env.harness,
            mode=session.mode,
            config_path=sources.get(instance.name, next(iter(polar_paths.values()))),
            delivery=cfg.delivery,
        )


def _check_multi_trace(path: Path, config: dict[str, Any], megatron: bool, agents: list[RecipeAgent]) -> None:
    """``grpo.gym_multi_trace: true`` trains on every trace of each rollout (NeMo-RL PR #4078, open;
    ``docs/guides/gym-multi-trace-grpo.md``): synchronous GRPO, the Megatron policy, a token-level loss without
    sequence-level ratios, and agents that deliver the ``training_traces`` envelope."""
    loss = config.get("loss_fn") or {}
    problems = [
        (bool(config["grpo"].get("async_grpo", {}).get("enabled")), "grpo.async_grpo.enabled must be false"),
        (not megatron, "policy.megatron_cfg.enabled must be true"),
        (not loss.get("token_level_loss", True), "loss_fn.token_level_loss must be true"),
        (bool(loss.get("sequence_level_importance_ratios")), "loss_fn.sequence_level_importance_ratios must be false"),
    ]
    problems += [(a.delivery != "all_traces", f"Gym agent {a.instance} must set delivery: all_traces") for a in agents]
    for broken, why in problems:
        if broken:
            raise RecipeError(f"{path}: grpo.gym_multi_trace trains on every trace of a rollout: {why}")


def _dataset_paths(data: dict[str, Any], split: str) -> list[str]:
    entry = data.get(split)
    entries = entry if isinstance(entry, list) else [entry] if isinstance(entry, dict) else []
    default = data.get("default") or {}
    return [
        str(e.get("data_path", default.get("data_path")))
        for e in entries
        if e.get("data_path", default.get("data_path"))
    ]


def _check_data(path: Path, config: dict[str, Any], agent_names: set[str]) -> list[Path]:
    """Every dataset row must be JSON whose agent_ref names one of the recipe's Polar agents (Gym routes by it)."""
    data = config.get("data") or {}
    found = []
    for split in ("train", "validation"):
        for raw in _dataset_paths(data, split):
            file = Path(raw)
            if not file.is_file():
                raise RecipeError(f"{path}: data.{split} data_path {raw} does not exist")
            with file.open() as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise RecipeError(f"{path}: {file}:{n} is not JSON: {exc}") from None
                    ref = row.get("agent_ref", {}).get("name") if isinstance(row, dict) else None
                    if ref not in agent_names:
                        raise RecipeError(
                            f"{path}: {file}:{n} routes to agent_ref.name {ref!r}, not to one of the recipe's Polar "
                            f"agents ({', '.join(sorted(agent_names))})"
                        )
            found.append(file)
    if not found:
        raise RecipeError(f"{path}: data.train has no data_path")
    return found
