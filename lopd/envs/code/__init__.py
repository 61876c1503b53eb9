"""The code domain: HumanEval tasks, graded by running the candidate in a real sandbox.

- :mod:`.sandbox`: namespaces + unprivileged uid + rlimits around one Python run;
- :mod:`.harness` (child) / :mod:`.checks` / :mod:`.grading` (parent): the candidate's return
  values cross the sandbox as plain data, the verdict is computed outside it;
- :mod:`.tasks`, :mod:`.env`, :mod:`.experts`: the multi-turn environment and its scripted agents;
- :mod:`.hostile`: candidates that try to cheat or escape, each of which must score 0;
- ``humaneval_pass_at_k``: the unbiased pass@k estimator (:mod:`lopd.envs.passk`, shared: the evaluate stage uses it).
"""

from . import hostile
from .checks import ProblemParseError, ProblemTests, parse_problem
from .env import CodeEnv, StepResult, bank_entry, extract_code, observation_lite
from .experts import CanonicalExpert, null_solution, run_episode
from .grading import Verdict, grade
from lopd.envs.passk import humaneval_pass_at_k
from .sandbox import (SandboxError, SandboxLimits, SandboxResult, SandboxUnavailable, run_python, sandbox_available,
                      sandbox_unavailable_reason)
from .tasks import SPLIT_SIZES, CodeTask, load_tasks

__all__ = ["SPLIT_SIZES", "CanonicalExpert", "CodeEnv", "CodeTask", "ProblemParseError", "ProblemTests",
           "SandboxError", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "StepResult", "Verdict",
           "bank_entry", "extract_code", "grade", "humaneval_pass_at_k", "load_tasks", "null_solution",
           "observation_lite", "parse_problem", "run_episode", "run_python", "sandbox_available",
           "sandbox_unavailable_reason"]
