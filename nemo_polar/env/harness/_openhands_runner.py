"""The OpenHands SDK harness's entry point: an OpenHands agent with its terminal, file-editor, task-tracker and
sub-agent (``task``) tools working on one instruction in a local workspace until it finishes.

Run by the harness's own Python 3.12 inside the sandbox (never imported by nemo_polar): ``python runner.py
WORKSPACE INSTRUCTION``. The model comes from ``LLM_MODEL``, ``LLM_BASE_URL`` and ``LLM_API_KEY`` (the OpenHands
CLI's names); the rest from ``POLAR_OPENHANDS`` (JSON: ``stream``, ``max_iterations``, ``condenser_max_size``,
``condenser_keep_first``). Prints one JSON line, the run's outcome, and exits 0 only if the agent finished.
"""

from __future__ import annotations

import json
import os
import sys

# Offline: litellm's bundled model-cost map (not a download at import), no .env search; no banner on stdout.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
os.environ.setdefault("LOG_LEVEL", "WARNING")

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.sdk.context.condenser import LLMSummarizingCondenser
from openhands.sdk.conversation.response_utils import get_agent_final_response
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.preset.default import register_builtins_agents
from openhands.tools.task import TaskToolSet
from openhands.tools.task_tracker import TaskTrackerTool
from openhands.tools.terminal import TerminalTool


def main() -> int:
    workspace, instruction = sys.argv[1], sys.argv[2]
    options = json.loads(os.environ.get("POLAR_OPENHANDS") or "{}")
    llm = LLM(
        model=os.environ["LLM_MODEL"],
        base_url=os.environ["LLM_BASE_URL"],
        api_key=os.environ["LLM_API_KEY"],
        stream=options.get("stream", False),
        usage_id="agent",
        input_cost_per_token=0.0,  # a served model has no price in litellm's map: no cost warning per call
        output_cost_per_token=0.0,
    )
    register_builtins_agents(enable_browser=False)  # the sub-agent types `task` offers (general-purpose, ...)
    tools = [TerminalTool.name, FileEditorTool.name, TaskTrackerTool.name, TaskToolSet.name]
    condenser = LLMSummarizingCondenser(
        llm=llm.model_copy(update={"usage_id": "condenser"}),
        max_size=options.get("condenser_max_size", 80),
        keep_first=options.get("condenser_keep_first", 4),
    )
    agent = Agent(llm=llm, tools=[Tool(name=name) for name in tools], condenser=condenser)
    conversation = Conversation(
        agent=agent,
        workspace=workspace,
        persistence_dir=os.path.join(os.environ["HOME"], ".openhands", "conversations"),
        max_iteration_per_run=options.get("max_iterations", 100),
        visualizer=None,
    )
    conversation.send_message(instruction)
    conversation.run()
    state = conversation.state
    status = str(state.execution_status.value)
    print(json.dumps({"status": status, "final": get_agent_final_response(state.events), "events": len(state.events)}))
    conversation.close()
    return 0 if status == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
