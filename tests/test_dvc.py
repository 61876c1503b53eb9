"""DVC: dvc.yaml's stages against the code (fast), then `dvc repro` of the smoke pipeline in a
temporary clone of the working tree, a no-op second repro, and a `dvc exp run --temp` after one
distillation param changed (slow: the smoke pipeline through DVC, about 3 minutes on 2 cores)."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lopd.config import Params
from lopd.stages import STAGES

# Modules that never change a stage's outputs: the params schema (values come from params.yaml),
# paths, atomic writes, MLflow tracking, Prefect events. Every other imported module is a dep.
INFRA = {"lopd/__init__.py", "lopd/config.py", "lopd/layout.py", "lopd/io.py", "lopd/ops/tracking.py", "lopd/ops/events.py"}
# ... and each layer's package __init__ that holds only its docstring (``from lopd.memory import index``).
_REPO = Path(__file__).resolve().parents[1]
INFRA |= {f.relative_to(_REPO).as_posix() for f in (_REPO / "lopd").glob("*/__init__.py")
          if all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in ast.parse(f.read_text()).body)}


def _dvc_yaml(repo: Path) -> dict:
    return yaml.safe_load((repo / "dvc.yaml").read_text())


def _module_file(repo: Path, module: str) -> Path | None:
    base = repo / Path(*module.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.exists():
            return f
    return None


def import_closure(repo: Path, module: str) -> set[str]:
    """Files (relative to the repo) of every ``lopd`` module ``module`` imports, transitively, function-level imports included."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        f = _module_file(repo, todo.pop())
        rel = f.relative_to(repo).as_posix() if f else None
        if rel is None or rel in seen:
            continue
        seen.add(rel)
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lopd") and node.level == 0:
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names if _module_file(repo, f"{node.module}.{a.name}")]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("lopd")]
    return seen


def _stage_module(name: str) -> str:
    return "lopd.stages." + STAGES[name].__name__  # the registry names the module (lopd/stages/<name>.py)


def test_every_stage_takes_its_profile_from_the_one_var(repo):
    d = _dvc_yaml(repo)
    assert d["vars"] == [{"profile": "demo"}]
    assert list(d["stages"]) == list(STAGES)
    for name, stage in d["stages"].items():
        assert stage["cmd"] == f"python -m lopd.cli {name.replace('_', '-')} --profile ${{profile}}"
        assert "configs/profiles/${profile}.yaml" in stage["deps"]
    assert "demo" not in json.dumps(d["stages"]) and "smoke" not in json.dumps(d["stages"])


def test_stage_deps_cover_every_module_the_stage_imports(repo):
    for name, stage in _dvc_yaml(repo)["stages"].items():
        deps = [str(x) for x in stage["deps"]]
        closure = import_closure(repo, _stage_module(name))
        assert f"lopd/stages/{STAGES[name].__name__}.py" in closure
        uncovered = sorted(f for f in closure - INFRA if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps))
        assert not uncovered, f"dvc.yaml stage {name} misses deps {uncovered}"
        listed = {d for d in deps if d.startswith("lopd/")}
        unused = sorted(d for d in listed if not any(f == d or f.startswith(d + "/") for f in closure))
        assert not unused, f"dvc.yaml stage {name} lists modules it does not import: {unused}"


def _param_reads(path: Path) -> set[str]:
    """``p.section`` / ``p.section.key`` (also ``self.p.``, ``params.``) read in a module, as dotted names."""
    out = set()
    tree = ast.parse(path.read_text())
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # p.model in p.model.dtype
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        chain, cur = [], node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        root = cur.id if isinstance(cur, ast.Name) else None
        if root == "self" and chain and chain[-1] == "p":
            chain.pop()
        elif root not in ("p", "params"):
            continue
        chain.reverse()
        if chain and chain[0] in Params.model_fields:
            sub = Params.model_fields[chain[0]].annotation
            out.add(".".join(chain[:2]) if len(chain) > 1 and hasattr(sub, "model_fields") and chain[1] in sub.model_fields else chain[0])
    return out


def test_stage_params_exist_and_cover_what_the_stage_module_reads(repo):
    for name, stage in _dvc_yaml(repo)["stages"].items():
        declared = [str(x) for x in stage["params"]]
        for key in declared:
            section, _, field = key.partition(".")
            assert section in Params.model_fields, f"{name}: params {key} is no section"
            if field:
                assert field in Params.model_fields[section].annotation.model_fields, f"{name}: params {key} is no field"
        reads = _param_reads(repo / f"lopd/stages/{STAGES[name].__name__}.py")
        reads -= {"tracking", "paths", "profile"}  # where runs are logged/written, not what is computed
        missing = sorted(r for r in reads if not any(r == k or r.startswith(k + ".") for k in declared))
        assert not missing, f"dvc.yaml stage {name} reads params it does not declare: {missing}"


# ----------------------------------------------------------------------------- dvc repro in a clone


def _clone(repo: Path, dst: Path) -> None:
    """Tracked + untracked-not-ignored files of the working tree (not dvc.lock), as a fresh git repo."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = repo / rel
        if rel == "dvc.lock" or not src.is_file():
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / rel)
    git = ["git", "-c", "user.name=lopd-test", "-c", "user.email=lopd-test@localhost"]
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    if not (dst / ".dvc").is_dir():
        _dvc(dst, "init", "-q")
    subprocess.run(["git", "add", "-A"], cwd=dst, check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], cwd=dst, check=True)
    subprocess.run(["git", "config", "user.name", "lopd-test"], cwd=dst, check=True)  # for dvc exp's commits
    subprocess.run(["git", "config", "user.email", "lopd-test@localhost"], cwd=dst, check=True)


def _env(mlflow_uri: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # the venv's python
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               DVC_NO_ANALYTICS="1", PYTHONUNBUFFERED="1")
    if mlflow_uri:
        env["MLFLOW_TRACKING_URI"] = mlflow_uri
    return env


def _dvc(cwd: Path, *args: str, mlflow_uri: str | None = None) -> subprocess.CompletedProcess:
    dvc = Path(sys.executable).parent / "dvc"
    return subprocess.run([str(dvc), *args], cwd=cwd, env=_env(mlflow_uri), capture_output=True, text=True, timeout=1800)


def _ran(out: str) -> list[str]:
    return re.findall(r"^Running stage '(\w+)'", out, re.M)


def _runs(uri: str):
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["lopd"], output_format="list")


@pytest.mark.slow
def test_dvc_repro_smoke_then_nothing_then_only_distill_and_evaluate(repo, tmp_path):
    clone = tmp_path / "repo"
    _clone(repo, clone)
    text = (clone / "dvc.yaml").read_text()
    text, n = re.subn(r"^(\s*- profile:\s*)demo\s*$", r"\1smoke", text, flags=re.M)
    assert n == 1, "dvc.yaml must choose the profile in one `vars` entry"
    (clone / "dvc.yaml").write_text(text)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    # 1. everything runs, in order, and every declared output exists
    r = _dvc(clone, "repro", mlflow_uri=uri)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert _ran(r.stdout) == list(STAGES)
    stages = _dvc_yaml(clone)["stages"]
    for name, stage in stages.items():
        for kind in ("outs", "metrics", "plots"):
            for out in stage.get(kind, []):
                path = clone / (next(iter(out)) if isinstance(out, dict) else out)
                assert path.exists() and (path.is_file() or any(path.iterdir())), f"{name}: {path} missing or empty"
    lock = yaml.safe_load((clone / "dvc.lock").read_text())
    assert set(lock["stages"]) == set(STAGES)
    assert "--profile smoke" in lock["stages"]["distill"]["cmd"]
    bank_md5 = next(o["md5"] for o in lock["stages"]["collect"]["outs"] if o["path"] == "data/bank")

    # every stage's MLflow run names the code's commit (the clone's: `python -m` ran its code) and the bank DVC locked
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    runs = _runs(uri)
    assert {r.data.tags["stage"] for r in runs} == set(STAGES)
    for run in runs:
        tags = run.data.tags
        assert tags["git_commit"] == head and tags["git_dirty"] == "false"
        assert tags["dvc_stage"] == tags["stage"]
        if tags["stage"] == "bootstrap":
            assert tags["bank_dvc_hash"] == "untracked"
        else:
            assert tags["bank_dvc_hash"] == bank_md5, (run.info.run_name, tags)
            # collect's run ends before DVC writes its lock entry; later stages read the lock
            assert tags["bank_dvc_source"] == ("computed" if tags["stage"] == "collect" else "dvc.lock")

    # 2. nothing to do
    r = _dvc(clone, "repro", mlflow_uri=uri)
    assert r.returncode == 0 and "Data and pipelines are up to date." in r.stdout and _ran(r.stdout) == []

    # 3. one distillation param: only distill is out of date; the experiment re-runs distill, evaluate and the gate
    params = (clone / "params.yaml").read_text()
    params, n = re.subn(r"^(  margin:) 0\.05\b", r"\1 0.1", params, flags=re.M)
    assert n == 1
    (clone / "params.yaml").write_text(params)
    status = json.loads(_dvc(clone, "status", "--json").stdout)
    assert set(status) == {"distill"} and "params.yaml" in json.dumps(status["distill"])
    # --temp runs in a copy under .dvc/tmp/exps; no MLFLOW_TRACKING_URI: the default store must be the clone's
    r = _dvc(clone, "exp", "run", "--temp", "-n", "margin-0.1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert _ran(r.stdout) == ["distill", "evaluate", "promote"]
    for name in ("bootstrap", "collect", "ingest", "index", "cold_start"):
        assert re.search(rf"Stage '{name}' (is cached|didn't change)", r.stdout), r.stdout[-2000:]
    exp_runs = _runs(f"sqlite:///{clone / 'mlruns' / 'mlflow.db'}")
    assert {r.data.tags["stage"] for r in exp_runs} == {"distill", "evaluate", "promote"}
    assert all(r.data.params["distill.margin"] == "0.1" and r.data.tags["dvc_exp_name"] == "margin-0.1" for r in exp_runs)
    assert all(r.info.artifact_uri.startswith((clone / "mlruns").as_uri()) for r in exp_runs)
