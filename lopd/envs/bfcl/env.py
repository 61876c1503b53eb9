"""``BFCLEnv``: one BFCL multi-turn entry as an episode, scored after every user turn like BFCL's checker.

Within a user turn the agent calls tools (one or more ``<tool_call>`` blocks per message; each result
comes back as a tool response) until it answers in plain text. That ends the turn: the turn's ground
truth runs on a second, ground-truth copy of the backends, and the turn passes when (BFCL's
``multi_turn_checker``)

- its ground truth is empty (a ``miss_func`` / ``miss_param`` turn: nothing is checked), or
- the agent made at least one call in it, every involved instance's state equals the ground-truth
  copy's (``state_checker``), and the ground truth's execution results are a subset of all the agent's
  results so far (``response_checker``).

Then the next user turn arrives (a user message). ``miss_func``'s held-out functions join the tool list
at their turn, announced with BFCL's own prompt. Reward = the fraction of turns that pass; success =
every turn passes (BFCL's accuracy). More than ``max_steps_per_turn`` calling messages in one turn
ends the episode as failed (BFCL force-quits the entry after ``MAXIMUM_STEP_LIMIT`` = 20).
"""

from __future__ import annotations

import json

from lopd.envs.bfcl.data import BFCLTask, function_docs
from lopd.envs.bfcl.sandbox import Rejected, Sandbox, parse_python_call, parse_tool_calls
from lopd.envs.episode import StepResult
from lopd.envs.protocol import OPEN

# BFCL's parameter types as JSON-schema types (what a Qwen3 tools block expects).
_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "any": "string", "bool": "boolean"}
SYSTEM = ("You are an agent that completes the user's requests by calling the functions below. Within one request, "
          "keep calling functions until it is done, then answer in plain text; the next request may follow.")


def _schema(node):
    if isinstance(node, dict):
        return {k: (_JSON_TYPES.get(v, v) if k == "type" and isinstance(v, str) else _schema(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_schema(v) for v in node]
    return node


def as_tool(doc: dict) -> dict:
    """A BFCL function doc as an OpenAI/Qwen3 tool."""
    return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                             "parameters": _schema(doc.get("parameters", {}))}}


def tools_block(docs) -> str:
    """The tool section Qwen3's chat template appends to the system message (Hermes ``<tool_call>`` format)."""
    tools = "".join("\n" + json.dumps(as_tool(d), ensure_ascii=False) for d in docs)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" + tools + "\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")


class BFCLEnv:
    """One BFCL multi-turn entry, played turn by turn (``initial_observation()`` / ``step(action)``)."""

    def __init__(self, task: BFCLTask, max_steps_per_turn: int | None = None):
        from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

        self.task = task
        self.max_steps_per_turn = MAXIMUM_STEP_LIMIT if max_steps_per_turn is None else max_steps_per_turn
        long_context = "long_context" in task.category
        self.sandbox = Sandbox(task.involved_classes, task.initial_config, long_context)
        self.truth = Sandbox(task.involved_classes, task.initial_config, long_context)  # ground truth, turn by turn
        held = {name for names in task.missed_function.values() for name in names}
        docs = [d for c in task.involved_classes for d in function_docs(c)]
        self.docs = [d for d in docs if d["name"] not in held]
        self.held_docs = {t: [d for d in docs if d["name"] in names] for t, names in task.missed_function.items()}
        self.allowed = {d["name"] for d in self.docs}
        self.turn, self.steps_in_turn, self.calls_in_turn = 0, 0, 0
        self.results: list[str] = []  # every dispatched call's result, all turns (BFCL's response check reads them)
        self.passed: list[bool] = []
        self.rejected = 0
        self.done = False

    def system_prompt(self) -> str:
        return SYSTEM + "\n\n" + tools_block(self.docs)

    def _user_message(self, turn: int) -> str:
        """The user's text for ``turn``; a held-out function turn announces the functions with BFCL's prompt."""
        from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

        if turn in self.held_docs:
            self.docs += self.held_docs[turn]
            self.allowed |= {d["name"] for d in self.held_docs[turn]}
            functions = json.dumps([as_tool(d) for d in self.held_docs[turn]], ensure_ascii=False)
            return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=functions)
        return "\n\n".join(m["content"] for m in self.task.turns[turn] if m["role"] == "user")

    def initial_observation(self) -> list[dict]:
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": self._user_message(0)}]

    # -- one assistant message

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("episode is over")
        if OPEN not in action:  # a text answer ends the user turn
            return self._end_turn()
        self.steps_in_turn += 1
        calls, errors = parse_tool_calls(action)
        outputs = [f"Error: {e}" for e in errors]
        for name, args, kwargs in calls:
            try:
                out = self.sandbox.call(name, args, kwargs, self.allowed)
            except Rejected as e:
                self.rejected += 1
                outputs.append(f"Error: {e}")
                continue
            self.calls_in_turn += 1
            self.results.append(out)
            outputs.append(out)
        self.rejected += len(errors)
        if self.steps_in_turn > self.max_steps_per_turn:  # BFCL: `count > MAXIMUM_STEP_LIMIT` force-quits
            self.passed.append(False)
            return self._finish(forced=True)
        return StepResult("\n</tool_response>\n<tool_response>\n".join(outputs) or "Error: no tool call", 0.0, False,
                          {"short": f"{len(calls)} calls", "observation_role": "tool"})

    def _end_turn(self) -> StepResult:
        self.passed.append(self._score_turn(self.turn))
        self.turn += 1
        self.steps_in_turn = self.calls_in_turn = 0
        if self.turn >= len(self.task.turns):
            return self._finish()
        return StepResult(self._user_message(self.turn), 0.0, False, {"short": "next turn", "observation_role": "user"})

    def _score_turn(self, turn: int) -> bool:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

        truth = self.task.ground_truth[turn]
        truth_results = []
        for c in truth:  # every method is allowed here: it is the answer
            try:
                truth_results.append(self.truth.call(*parse_python_call(c)))
            except Rejected as e:  # never seen in BFCL v4's data; counted, never executed another way
                truth_results.append(f"Error: ground truth rejected: {e}")
        if not truth:
            return True  # BFCL checks nothing on an empty ground-truth turn
        if self.calls_in_turn == 0:
            return False  # "multi_turn:empty_turn_model_response"
        return bool(state_checker(self.sandbox.instances, self.truth.instances)["valid"]
                    and response_checker(self.results, truth_results, turn)["valid"])

    def _finish(self, forced: bool = False) -> StepResult:
        self.done = True
        n = len(self.task.turns)
        checks = {f"turn{i}": (self.passed[i] if i < len(self.passed) else False) for i in range(n)}
        success = not forced and len(self.passed) == n and all(self.passed)
        return StepResult(None, sum(checks.values()) / n, True,
                          {"success": success, "checks": checks, "short": "done", "rejected": self.rejected, "forced": forced})
