"""mini-swe-agent: a Python harness (its own venv) that speaks Chat Completions through litellm, not streamed.

Two modes, as the package ships them: ``tool_calls`` (``mini.yaml``: every reply holds ``bash`` tool calls) and
``text`` (``mini_textbased.yaml`` with the ``litellm_textbased`` model class: exactly one fenced
``mswea_bash_command`` block per reply, the observation a user message). A run ends when a command's first output
line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``; a reply without a valid action is dropped from the history and
answered with a format error, so that sampled reply never reappears in a later prompt.
"""

from __future__ import annotations

import shlex
from typing import Any, Literal

from nemo_polar.env.harness.base import Endpoint, EnvOption, GymValues, Launch, PythonHarness, Unsupported, one_of
from nemo_polar.env.harness.script import Action, EditFile, Final, ToolCalls
from nemo_polar.proxy.store.sessions import ScriptCall, ScriptTurn

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# A one-line replace the scripted policy runs with the sandbox's python3 (the agent has only bash).
REPLACE = (
    "import pathlib, sys; p = pathlib.Path(sys.argv[1]); s = p.read_text(); "
    "assert s.count(sys.argv[2]) == 1, 'the old text is not in the file exactly once'; "
    "p.write_text(s.replace(sys.argv[2], sys.argv[3]))"
)
CONFIGS = {"tool_calls": ("mini.yaml", "litellm"), "text": ("mini_textbased.yaml", "litellm_textbased")}


class MiniSweAgent(PythonHarness):
    name = "mini_swe_agent"
    package = "mini-swe-agent"
    version = "2.4.6"
    bin = "mini"
    module = "minisweagent.run.mini"
    order = 5
    demo_task = "polar__iniconf-1"
    env_options = (EnvOption("mode", "tool_calls", "or text: one fenced mswea_bash_command block per reply"),)
    gym = GymValues(title="mini-swe-agent", agent="mini-swe-agent", api="OpenAI Chat Completions API, not streamed")

    def __init__(self, mode: Literal["tool_calls", "text"] = "tool_calls", step_limit: int = 0) -> None:
        """``mode``: ``tool_calls`` or ``text`` (above). ``step_limit``: model calls before the run stops (0: none)."""
        self.mode = one_of("mini_swe_agent", "mode", mode, CONFIGS)
        self.step_limit = step_limit

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        config, model_class = CONFIGS[self.mode]
        argv = [
            *self.command(root),
            "-m",
            f"openai/{endpoint.model}",  # litellm's OpenAI provider: the bare name goes out in the body
            "--model-class",
            model_class,
            "-c",
            config,  # named first: any -c replaces the default config
            "-c",
            f"model.model_kwargs.api_base={endpoint.base_url}/v1",
            "-c",
            f"agent.step_limit={self.step_limit}",
            "-t",
            instruction,
            "--yolo",
            "--exit-immediately",
            "-o",
            f"{home}/trajectory.json",
        ]
        env = {
            "OPENAI_API_KEY": endpoint.api_key,
            "MSWEA_CONFIGURED": "true",  # else the first-run wizard prompts and aborts on a closed stdin
            "MSWEA_COST_TRACKING": "ignore_errors",  # a served model has no price in litellm's map
            "MSWEA_GLOBAL_CONFIG_DIR": f"{home}/.config/mini-swe-agent",
            "MSWEA_SILENT_STARTUP": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its cost map from the internet at import
        }
        return Launch(argv=argv, env=env)

    def transcript(self, stdout: str) -> Any:
        return None  # it prints a rich console log; its account is the trajectory file it leaves in its home

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "bash", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "bash", {"command": f"cat {shlex.quote(path)}"}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "bash", {"command": shlex.join(["python3", "-c", REPLACE, path, old, new])}

    def action_turn(self, action: Action, workspace: str) -> ScriptTurn:
        """A final answer is the text with the submit command (a reply without a command is a format error); in
        ``text`` mode the command is written as the one fenced block the agent reads."""
        if isinstance(action, Final):
            turn = ScriptTurn(content=action.text, tool_calls=[ScriptCall(name="bash", arguments={"command": SUBMIT})])
        else:
            turn = super().action_turn(action, workspace)
        if self.mode == "tool_calls":
            return turn
        if isinstance(action, ToolCalls) or len(turn.tool_calls) != 1:
            raise Unsupported("mini-swe-agent's text mode takes exactly one command per reply")
        command = turn.tool_calls[0].arguments["command"]
        what = turn.content or ("Editing the file." if isinstance(action, EditFile) else "Running the next command.")
        return ScriptTurn(content=f"{what}\n\n```mswea_bash_command\n{command}\n```")
