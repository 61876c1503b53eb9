"""`lopd` — one subcommand per pipeline stage, plus `run` (all stages), `sweep` (methods × seeds) and `params`.

Every subcommand takes ``--params``, ``--profile`` and ``--set key=value`` (repeatable), and
validates the resolved params before any compute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import time

from lopd.config import DEFAULT_PROFILE, ParamsError, load_params
from lopd.ops.tracking import pipeline_run
from lopd.stages import STAGES


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help=f"overlay from configs/profiles/ (default: {DEFAULT_PROFILE}; 'none' for paper scale)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one param, e.g. --set distill.margin=0.1 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lopd", description="Latent On-Policy Self-Distillation pipeline")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher passes it
    sub = parser.add_subparsers(dest="command", required=True)
    _common(sub.add_parser("params", help="print the resolved params as JSON and exit"))
    _common(sub.add_parser("run", help="run every stage in order, in-process"))
    _common(sub.add_parser("export-base", help="write models/base (pre-trained with bootstrap.source=train) as the committed base in lopd/assets/base, with its model card"))
    sweep = sub.add_parser("sweep", help="distill + evaluate every method at every seed, then the profile's sweep.ablations over the same seeds; "
                                               "mean ± std, t-intervals, efficiency and ablation rows in MLflow and metrics/sweep.*")
    _common(sweep)
    sweep.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    sweep.add_argument("--methods", default="lopd,opsd,grpo,vanilla,sft", help="comma-separated methods (default: lopd,opsd,grpo,vanilla,sft)")
    sweep.add_argument("--name", default="sweep", help="the sweep's name: seeds under runs/<name>/, tables metrics/<name>.{md,csv,json} "
                                                       "(e.g. --name margin0 --set distill.margin=0 for an ablation; default: sweep)")
    sweep.add_argument("--no-ablations", action="store_true",
                       help="skip the profile's sweep.ablations (each otherwise runs as its own LOPD sweep <name>-<ablation> over the same seeds, "
                            "folded into the report); e.g. for a part of a sweep that another will --join")
    report = sub.add_parser("sweep-report", help="efficiency, curves (mean ± std over seeds) and ablation rows of a finished sweep: "
                                                 "metrics/<name>.{json,md}, metrics/plots/*.png, logged to its MLflow parent run")
    _common(report)
    report.add_argument("--name", default="sweep", help="the main sweep's name (default: sweep)")
    report.add_argument("--ablation", action="append", default=[], metavar="NAME|JSON",
                        help="an ablation sweep over the same seeds or a subset: its --name under this root, or the path to its metrics json (repeatable)")
    report.add_argument("--join", action="append", default=[], metavar="NAME|JSON",
                        help="another sweep of the same methods and params over other seeds (run beside this one), whose seeds join this sweep's (repeatable)")
    sim = sub.add_parser("deploy-sim", help="a simulated deployment, week by week: the champion plays fresh train tasks, "
                                            "its trajectories are ingested, a retrain from it meets the gate; metrics/deployment.json")
    _common(sim)
    sim.add_argument("--weeks", type=int, default=4, help="simulated weeks after the first champion (default: 4)")
    sim.add_argument("--tasks-per-week", type=int, default=64, help="fresh train tasks the champion plays each week (default: 64)")
    sim.add_argument("--seed", type=int, default=None, help="the simulation's seed: every stage after bootstrap (collect, training, "
                                                             "traffic, gate) runs with it; the base stays at params' seed, as in a sweep "
                                                             "(default: params' seed)")
    ui = sub.add_parser("ui", help="print the MLflow UI's links (runs table, newest pipeline run and sweep), then serve the UI over the project store")
    _common(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000, help="port (default: 5000)")
    ui.add_argument("--links-only", action="store_true", help="print the links and exit without serving")
    for name in STAGES:
        stage = sub.add_parser(name.replace("_", "-"), help=f"run the {name} stage")
        _common(stage)
        if name == "distill":
            stage.add_argument("--method", action="append", default=[], metavar="METHOD",
                               help="train only this method (repeatable); same as --set distill.methods=[...]. "
                                    "Results of other methods run earlier with the same params stay in metrics/distill.json")
            stage.add_argument("--nproc", type=int, default=1, metavar="N",
                               help="train data-parallel on N processes (needs distill.engine=deepspeed; one GPU each where CUDA is); "
                                    "same as torchrun --nproc_per_node N -m lopd.cli distill ...")
        if name == "ingest":
            stage.add_argument("files", nargs="*", metavar="FILE.jsonl",
                               help="trajectories a deployed agent played (format: docs/operate.md); same as --set ingest.files=[...]")
        if name == "promote":
            stage.add_argument("--version", type=int, default=None, metavar="N",
                               help="move the alias champion to version N by hand (a rollback), without the gate; needs --reason")
            stage.add_argument("--reason", default=None, help="why the alias moves by hand (recorded on the version and in metrics/promotion.json)")
    return parser


def _quiet_libraries() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def stage_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` overrides plus what a stage's own flags mean in params (``--method``, ``ingest``'s files)."""
    methods, files = getattr(args, "method", None), getattr(args, "files", None)
    return (list(args.overrides) + ([f"distill.methods=[{','.join(methods)}]"] if methods else [])
            + ([f"ingest.files={json.dumps([os.path.abspath(f) for f in files])}"] if files else []))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet or os.environ.get("RANK", "0") != "0" else logging.INFO,  # one rank talks
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("alembic", "mlflow", "httpx", "urllib3", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    profile = None if args.profile in ("", "none") else args.profile
    try:
        params = load_params(args.params, profile, stage_overrides(args))
    except ParamsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command == "params":
        print(json.dumps(params.model_dump(), indent=2))
        return 0
    if args.command == "ui":
        return _ui(args, params)
    if args.command != "sweep-report":
        from lopd.envs.registry import get_environment

        try:  # env.name's environment is built here, so that one it cannot build fails before any compute
            get_environment(params)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if getattr(args, "nproc", 1) != 1:
        return _launch(args, params, argv if argv is not None else sys.argv[1:])
    if args.command == "sweep":
        from lopd.experiments import sweep

        try:  # bad --seeds / --methods fail here, before any compute
            seeds, methods, name = sweep.parse_seeds(args.seeds), sweep.parse_methods(args.methods), sweep.check_name(args.name)
        except ParamsError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    _quiet_libraries()
    from lopd.ops.registry import RegistryError
    from lopd.ops.validation import DataValidationError

    if args.command == "sweep-report":
        from lopd.experiments import sweep_report

        try:
            if args.join:
                sweep_report.join(params, args.name, args.join)
            sweep_report.build(params, args.ablation, args.name)
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print((params.root() / "metrics" / f"{args.name}.md").read_text(), end="")
        return 0
    if args.command == "sweep":
        from lopd.experiments import headline

        try:  # the methods, the profile's ablations over the same seeds, then the report
            result = headline.run(params, seeds, methods, name, ablations=not args.no_ablations)
        except (ParamsError, DataValidationError, FileNotFoundError, sweep.SweepError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2 if isinstance(e, ParamsError) else 1
        print((params.root() / "metrics" / f"{name}.md").read_text(), end="")
        logging.getLogger("lopd").info("sweep: MLflow parent run %s; tables in %s", result["parent_run_id"], params.root() / "metrics")
        return 0

    if args.command == "deploy-sim":
        from lopd.experiments import deployment

        try:
            deployment.check(params, args.weeks, args.tasks_per_week)  # before any compute
            result = deployment.run(params, args.weeks, args.tasks_per_week, seed=args.seed)
        except (ParamsError, DataValidationError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2 if isinstance(e, ParamsError) else 1
        for w in result["weeks"]:
            dev = "n/a" if w["dev_success"] is None else f"{w['dev_success']:.3f}"
            print(f"week {w['week']}: champion v{w['champion_version']} ({w['verdict']}), dev success {dev}, "
                  f"bank {w['bank_size']}, {w['generations']} generations, {w['wall_s']:.0f} s")
        return 0

    if args.command == "export-base":
        from lopd.stages.bootstrap import export_base

        try:
            record = export_base(params)
        except (ParamsError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2 if isinstance(e, ParamsError) else 1
        print(json.dumps({k: v for k, v in record["metrics"].items() if k != "dev_action_accuracy"}, indent=2))
        return 0

    command = args.command.replace("-", "_")
    if command == "promote" and (args.version is not None or args.reason is not None):
        return _manual_promote(args, params)
    stages = STAGES if command == "run" else {command: STAGES[command]}
    try:
        # `lopd run`: one MLflow parent run, every stage's run nested under it
        with pipeline_run(params, "run") if command == "run" else contextlib.nullcontext():
            for name, fn in stages.items():
                t0 = time.perf_counter()
                logging.getLogger("lopd").info("stage %s: start (profile %s)", name, params.profile)
                result = fn(params)
                summary = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) and k != "params"}
                logging.getLogger("lopd").info("stage %s: done in %.1fs %s", name, time.perf_counter() - t0, json.dumps(summary, default=str))
    except (ParamsError, DataValidationError, FileNotFoundError, RegistryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1 if not isinstance(e, ParamsError) else 2
    if "evaluate" in stages and os.environ.get("RANK", "0") == "0":  # what a run ends with: the test table
        from lopd import layout

        table = layout.metrics_path(params, "evaluate").with_suffix(".md")
        print(f"\n{table.read_text()}\n(test split; {table}; browse every run with `make ui`)")
    return 0


def _manual_promote(args, params) -> int:
    """``lopd promote --version N --reason "..."``: the alias moves by hand (a rollback), recorded like a gate decision."""
    from lopd.ops.registry import RegistryError
    from lopd.stages.promote import manual

    if args.version is None or not (args.reason or "").strip():
        print("error: lopd promote: --version N and --reason \"...\" go together (the reason is recorded on the version)", file=sys.stderr)
        return 2
    try:
        manual(params, args.version, args.reason)
    except RegistryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _ui(args, params) -> int:
    """The links first (MLflow 3 may open the experiment on its GenAI overview), then ``mlflow server`` in this process."""
    from lopd.ops.tracking import artifact_location, tracking_uri, ui_links

    for line in ui_links(params, f"http://{args.host}:{args.port}"):
        print(line, flush=True)
    if args.links_only:
        return 0
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", args.host, "--port", str(args.port), "--workers", "1",
           "--backend-store-uri", tracking_uri(params), "--default-artifact-root", artifact_location(params)]
    os.execv(sys.executable, cmd)  # Ctrl-C stops the server


def _launch(args, params, argv: list[str]) -> int:
    """``lopd distill --nproc N``: the same command on N processes under ``torch.distributed.run``."""
    if args.nproc < 1:
        print(f"error: --nproc = {args.nproc}: give a number of processes >= 1", file=sys.stderr)
        return 2
    if "WORLD_SIZE" in os.environ:
        print("error: --nproc inside a launched process (WORLD_SIZE is set): launch once, with --nproc or torchrun", file=sys.stderr)
        return 2
    if params.distill.engine != "deepspeed":
        print(f"error: params: distill.engine = {params.distill.engine!r} runs one process: add --set distill.engine=deepspeed to use --nproc",
              file=sys.stderr)
        return 2
    rest, skip = [], False
    for a in argv:  # the same arguments, less --nproc
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", "-m", "lopd.cli", *rest]
    logging.getLogger("lopd").info("distill: launching %d processes: %s", args.nproc, " ".join(cmd[1:]))
    # torchrun would give each rank 1 thread; share the cores instead (on GPUs the ranks barely use them)
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // args.nproc)), **os.environ}
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
