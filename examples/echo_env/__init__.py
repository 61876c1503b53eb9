"""A worked example of a user environment: "echo", the smallest task a policy can learn.

Each task asks the agent to repeat one word. The agent answers in plain text; a wrong answer gets
feedback (how many letters the word has when ``env.options.hint`` is true) and another try, up to
``env.max_turns``. Reward 1.0 for the exact word, else the share of leading letters it got right.

Run the whole pipeline on it (see docs/environments.md, "Adding an environment")::

    PYTHONPATH=examples lopd run --profile smoke --set env.name=echo_env:make

Everything LOPD needs comes from :func:`make`; nothing in ``lopd`` knows this package exists.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lopd.envs.episode import StepResult
from lopd.envs.registry import Environment

WORDS = ("apple", "river", "stone", "cloud", "amber", "maple", "otter", "piano", "quartz", "raven",
         "saddle", "tiger", "umbra", "velvet", "walnut", "yarrow", "zebra", "anchor", "bishop", "cactus",
         "dragon", "ember", "falcon", "garden", "harbor", "island", "jungle", "kettle", "lantern", "meadow",
         "nectar", "orchid", "pepper", "quiver", "rocket", "silver", "timber", "violet", "willow", "yellow",
         "badger", "candle", "desert", "engine", "forest", "glacier", "hollow", "insect", "jigsaw", "koala",
         "ladder", "marble", "needle", "oyster", "pillow", "rabbit", "sparrow", "tunnel", "unicorn", "wizard")
SPLIT_SIZES = {"train": 40, "dev": 10, "test": 10}  # along a fixed hash ranking of the words: disjoint splits


@dataclass(frozen=True)
class EchoTask:
    """A task: every environment's task has ``task_id``, ``text``, ``family`` and ``app``."""

    task_id: str
    word: str
    split: str
    family: str = "echo"  # per-family reports
    app: str = "echo"  # retrieval.scope = app: one scope for all

    @property
    def text(self) -> str:
        return f"Repeat this word exactly: {self.word}"


class EchoEnv:
    """One episode: ``initial_observation()`` then ``step(action)`` until ``done``."""

    def __init__(self, task: EchoTask, max_turns: int, hint: bool) -> None:
        self.task, self.max_turns, self.hint, self.turns = task, max_turns, hint, 0

    def initial_observation(self) -> list[dict]:
        return [{"role": "system", "content": "Answer with the word only."}, {"role": "user", "content": self.task.text}]

    def step(self, action: str) -> StepResult:
        self.turns += 1
        said, word = action.strip(), self.task.word
        prefix = next((i for i, (a, b) in enumerate(zip(said, word)) if a != b), min(len(said), len(word)))
        success = said == word
        reward = 1.0 if success else prefix / len(word)
        done = success or self.turns >= self.max_turns
        feedback = None if success else "wrong" + (f": the word has {len(word)} letters" if self.hint else "")
        info = {"short": "ok" if success else "wrong", "checks": {"exact": success}}
        if done:
            info["success"] = success
        return StepResult(feedback, reward, done, info)


class Echo:
    """The scripted expert: ``act(task, history) -> action``."""

    def act(self, task: EchoTask, history) -> str:
        return task.word


def tasks(split: str, n: int) -> list[EchoTask]:
    ranked = sorted(WORDS, key=lambda w: hashlib.sha256(f"echo/{w}".encode()).hexdigest())
    start = sum(size for s, size in SPLIT_SIZES.items() if list(SPLIT_SIZES).index(s) < list(SPLIT_SIZES).index(split))
    return [EchoTask(f"echo-{w}", w, split) for w in ranked[start:start + SPLIT_SIZES[split]][:n]]


def lite_text(task_text: str, actions: list[str], shorts: list[str]) -> str:
    """Observation-lite: the task, then each answer with its short result."""
    return "\n".join([f"Task: {task_text}", *(f"{a.strip()} -> {s}" for a, s in zip(actions, shorts))])


def make(params) -> Environment:
    """The factory ``env.name = echo_env:make`` names: params in, Environment out."""
    env, hint = params.env, bool(params.env.options.get("hint", True))
    return Environment(
        name="echo",
        tasks=tasks,
        make_env=lambda task: EchoEnv(task, env.max_turns, hint),
        lite_text=lite_text,
        success_threshold=env.success_threshold,
        groups={"short": "words of up to 5 letters", "long": "longer words"},  # optional: a report grouping
        group=lambda task: "short" if len(task.word) <= 5 else "long",
        expert=Echo,  # optional: bank top-up, expert checks, and (without `pretraining`) the base's demos
    )
