"""The ``locvit`` command line: one subcommand per pipeline step.

Rules and stages call it with explicit paths and each job's own config file (``--data-config`` /
``--run-config``, ``locvit.config.jobs``), rewritten only when that part of params.yaml changes; people give
``--params params.yaml`` (with ``train --variant``), validated before anything is written. A user's mistake
(``locvit.errors.LocvitError``) prints as one line and exits 1 (2 for a config that breaks the schema); any
other exception keeps its traceback, after a line saying where to report it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from locvit.config import ConfigError, load_params, validate_section
from locvit.config.run import run_config, validate_run_config, variant_seeds
from locvit.errors import EXIT_STOPPED, InputError, LocvitError, MissingFileError, Stopped, configure_logging
from locvit.io import JobConfig, read_json
from locvit.layout import REPORT_FILES, StudyLayout, per_seed


def config_file(path: Path, option: str):
    """The JSON config file an option names (Snakemake writes them); an error naming the option and the file."""
    return read_json(
        path, f"{option} file", "Run the job through Snakemake, which writes it (locvit job-configs writes them all)."
    )


def job_config(args, option: str, build):
    """A job's config: the file ``option`` names (Snakemake's), else built from ``--params`` by ``build`` (one
    of ``locvit.config.jobs``' functions), read as a ``locvit.io.JobConfig``: the job reads nothing
    else of the study's params, and a key it reads that the config lacks is an error naming it."""
    path = getattr(args, option.lstrip("-").replace("-", "_"))
    if path:
        return JobConfig(config_file(path, option), f"{option} {path}")
    return JobConfig(build(load_params(args.params, check_models=False)), f"{option.lstrip('-')} of {args.params}")


def cmd_validate(args) -> None:
    from locvit.versioning import DVC_PARAMS, stale_dvc_yaml

    params = load_params(args.params)
    n = sum(len(variant_seeds(params, v)) for v in params["variants"])
    seeds = sorted({len(variant_seeds(params, v)) for v in params["variants"]})
    print(
        f"{args.params}: valid; study {params['study']!r}, {len(params['variants'])} variant(s) x "
        f"{'-'.join(map(str, seeds))} seed(s) = {n} training run(s)"
    )
    if params["model_modules"] and args.params.resolve() == Path(DVC_PARAMS).resolve() and Path("dvc.yaml").is_file():
        unlisted = stale_dvc_yaml(Path("dvc.yaml"), params["model_modules"])
        if unlisted:
            print(
                f"note: dvc.yaml does not list {', '.join(unlisted)} (model_modules): dvc repro would not re-run "
                "after a change to them; run locvit dvc-yaml"
            )
    if args.cost:
        from locvit.analysis.cost import cost_lines, study_cost

        print("\n".join(cost_lines(study_cost(params, train_images=args.train_images))))


def cmd_status(args) -> None:
    from locvit.status import status

    print("\n".join(status(args.params, check=args.check)))


def cmd_accept(args) -> None:
    from locvit.status import accept

    print("\n".join(accept(args.params, args.jobs, args.cleared, args.why)))


def cmd_prepare(args) -> None:
    from locvit.data.prepare import prepare

    if args.data_config:
        data = validate_section("data", config_file(args.data_config, "--data-config"), "--data-config")
    else:
        data = load_params(args.params, check_models=False)["data"]
    manifest = prepare(data, {"train": args.train, "val": args.val, "test": args.test}, args.manifest)
    sizes = {s: manifest["splits"][s]["size"] for s in manifest["splits"]}
    print(f"prepared {manifest['source']} at {manifest['image_size']}px: {sizes}; data hash {manifest['data_hash']}")


def cmd_fetch(args) -> None:
    from locvit.data.sources import get_source

    data = load_params(args.params, check_models=False)["data"]
    print(get_source(data["source"], data["root"]).fetch())


def cmd_train(args) -> None:
    from locvit.tracking.run import system_metrics_interval
    from locvit.train.distributed import distributed
    from locvit.train.loop import train_run
    from locvit.train.state import listen

    listen()  # SIGURG/SIGUSR1 (a SLURM job's warning before its time limit): stop at a step, exit 75

    if args.run_config:
        cfgs = [validate_run_config(config_file(f, "--run-config")) for f in args.run_config]
        out_dirs = args.out_dir or []
        if len(out_dirs) != len(cfgs):
            raise ConfigError(
                [
                    f"--out-dir: {len(out_dirs)} folder(s) for {len(cfgs)} run config(s); give one per "
                    "run, in the same order"
                ],
                "--run-config",
            )
        if args.search_spec:
            from locvit.analysis.search import search_run_config

            spec = read_json(args.search_spec, "search spec", "Re-run the mask search.")
            cfgs = [search_run_config(cfg, spec) for cfg in cfgs]
        jobs = list(zip(cfgs, out_dirs))
    else:
        params = load_params(args.params)
        seeds = variant_seeds(params, args.variant)
        jobs = list(zip([run_config(params, args.variant, s) for s in seeds], per_seed(args.runs_dir, seeds, "")))
    interval = system_metrics_interval(args.system_metrics_s, None if args.run_config else params)
    with distributed():  # one process, or the group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK)
        for cfg, out_dir in jobs:
            train_run(
                cfg,
                args.train_data,
                args.val_data,
                args.manifest,
                out_dir,
                args.tracking_db,
                show_progress=args.progress,
                threads=args.threads and max(1, args.threads // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))),
                keep_finished=args.keep_finished,
                system_metrics_s=interval,
            )


def cmd_evaluate(args) -> None:
    from locvit.train.evaluate import evaluate_checkpoints

    for result in evaluate_checkpoints(
        args.checkpoint, args.out, args.data, args.manifest, args.tracking_db, threads=args.threads
    ):
        print(
            f"{result['variant']} seed {result['seed']}: test top-1 {100 * result['test_top1']:.2f}% "
            f"on {result['n']} images"
        )


def cmd_analyse(args) -> None:
    from locvit.analysis.analyse import analyse_checkpoints

    cfg = validate_section("analysis", config_file(args.analysis_config, "--analysis-config"), "--analysis-config")
    for record in analyse_checkpoints(
        args.checkpoint,
        args.json,
        args.npz,
        args.data,
        args.manifest,
        cfg["images"],
        tuple(cfg["als_kernel"]),
        args.profile,
        threads=args.threads,
    ):
        print(
            f"{record['variant']} seed {record['seed']}: {len(record['layers'])} attention layer(s), "
            f"ALS on {len(record['als_layers'])}"
        )


def cmd_throughput(args) -> None:
    from locvit.analysis.throughput import measure_throughput
    from locvit.config.jobs import throughput_config

    rows = measure_throughput(
        job_config(args, "--throughput-config", throughput_config), args.out, threads=args.threads
    )
    for row in rows.values():
        ratio = "" if row["ratio_vs_baseline"] is None else f", {row['ratio_vs_baseline']:.3f} x the baseline"
        print(
            f"{row['variant']}: {row['img_s_median']:.1f} img/s (rounds {row['img_s_low']:.1f} to "
            f"{row['img_s_high']:.1f}){ratio}"
        )
    print(f"throughput of {len(rows)} variant(s), {next(iter(rows.values()))['device']}: {args.out}")


def cmd_search_spec(args) -> None:
    from locvit.analysis.search import next_spec
    from locvit.io import write_json

    search = validate_section("mask_search", config_file(args.search_config, "--search-config"), "--search-config")
    previous = (
        read_json(args.previous_spec, "search spec", "Re-run the previous round.") if args.previous_spec else None
    )
    als = (
        read_json(args.previous_analysis, "analysis file", "Re-run the previous round's analyse step.")["als"]
        if args.previous_analysis
        else None
    )
    spec = next_spec(args.round, previous, als, search["all_above"], search["remove_below"])
    write_json(args.out, spec)
    print(f"round {args.round}: masked_heads {spec['masked_heads']}")
    for line in spec["rule"]:
        print(f"  {line}")


def cmd_search_table(args) -> None:
    from locvit.analysis.search import search_table
    from locvit.config.jobs import search_table_config
    from locvit.io import write_json, write_text
    from locvit.report.search import table_markdown

    cfg = job_config(args, "--search-table-config", search_table_config)
    fix = "Re-run the mask search (snakemake --cores all search)."
    rows = search_table(
        [read_json(f, "search spec", fix) for f in args.specs],
        [read_json(f, "analysis file", fix) for f in args.analyses],
        [read_json(f, "evaluation file", fix) for f in args.evals],
    )
    write_text(args.md, table_markdown(rows, cfg))
    write_json(
        args.json,
        {"rounds": rows, "searched_masked_heads": read_json(args.specs[-1], "search spec", fix)["masked_heads"]},
    )
    print(f"mask search table: {args.md}")


def cmd_report(args) -> None:
    from locvit.config.jobs import report_config
    from locvit.report.build import build_report

    cfg = job_config(args, "--report-config", report_config)
    extra = [
        (JobConfig(report_config(load_params(p, check_models=False)), f"report config of {p}"), d)
        for p, d in zip(args.extra_params, args.extra_study_dir)
    ]
    report = build_report(
        cfg,
        args.study_dir,
        args.out_dir,
        log_to_mlflow=args.mlflow,
        extra_studies=extra,
        tracking_db=args.tracking_db,
        params_file=args.params if args.params.is_file() else None,
    )
    print(
        f"results table: {args.out_dir / REPORT_FILES['md']}; {len(report['tables']) - 1} paper table(s), "
        f"{len(report['figures'])} figure(s); all on one page: {args.out_dir / REPORT_FILES['index']}"
    )
    for name, why in report["skipped"].items():
        print(f"  not written: {name}: {why}")
    tree = report["mlflow"].get("tree", {})
    if "seconds" in report["mlflow"]:
        print(f"MLflow: the report's links, figures and run tree logged in {report['mlflow']['seconds']:.3f} s")
    if "study_link" in tree:
        print(f"MLflow: the study's run {tree['study_link']}\n        its variants side by side {tree['compare_link']}")


def cmd_stats(args) -> None:
    from locvit.io import write_text
    from locvit.report.study import study_from_evaluations
    from locvit.report.tables import machines_markdown, write_results

    write_results(study_from_evaluations(*args.evaluations), args.out_dir)
    sources = " + ".join(map(str, args.evaluations))
    print(f"results table from {sources}: {args.out_dir / REPORT_FILES['md']} (also .csv, .tex)")
    if len(args.evaluations) > 1:  # several machines' runs pooled: is there a machine effect?
        names = [path.parent.name for path in args.evaluations]
        text = machines_markdown([study_from_evaluations(path) for path in args.evaluations], names)
        write_text(args.out_dir / "machines.md", text)
        print(f"the machine as a factor: {args.out_dir / 'machines.md'}")


def cmd_plan(args) -> None:
    from locvit.report.study import study_from_evaluations
    from locvit.report.tables import plan_markdown

    print(plan_markdown(study_from_evaluations(args.evaluations), args.delta), end="")


def cmd_sync_tracking(args) -> None:
    from locvit.tracking import default_uri, safe_uri
    from locvit.tracking.sync import sync_runs

    uri = safe_uri(default_uri(args.tracking_db))
    try:
        outcome = sync_runs(args.runs_dir, args.tracking_db, args.eval_dir)
    except (ConnectionError, PermissionError) as err:
        print(f"locvit sync-tracking: error: {err}; nothing uploaded", file=sys.stderr)
        raise SystemExit(1) from err
    done = len(outcome["uploaded"]) + len(outcome["evaluation"])
    print(
        f"{uri}: {len(outcome['uploaded'])} run(s) uploaded, {len(outcome['evaluation'])} test result(s) added, "
        f"{len(outcome['up_to_date'])} already complete" + ("" if done else "; nothing to upload")
    )
    if outcome["failed"]:
        print(
            f"locvit sync-tracking: error: {len(outcome['failed'])} run(s) not uploaded (see above): "
            f"{', '.join(outcome['failed'])}",
            file=sys.stderr,
        )
        raise SystemExit(1)


def cmd_results(args) -> None:
    from locvit.report.tables import as_markdown, as_text, read_results_csv, summary_lines

    if args.csv:  # any results.csv, e.g. a committed one (benchmarks/results/demo/results.csv)
        print(as_markdown(summary_lines(read_results_csv(args.csv))), end="")
        return
    params = load_params(args.params, check_models=False)
    table = StudyLayout.of(params).report_file("md")
    if not table.is_file():
        raise MissingFileError(f"{table} does not exist yet; run the pipeline first (make demo)")
    lines = summary_lines(read_results_csv(table.with_suffix(".csv")))
    if args.markdown:
        print(as_markdown(lines), end="")
        return
    print(
        f"Results of study {params['study']!r}: test top-1 over seeds (mean ± std, 95 % interval with the test set's "
        "error), the difference to the reference with its interval, the smallest difference the study could "
        "detect (MDE, 80 % power) and the verdict (docs/statistics.md)"
    )
    print(as_text(lines), end="")
    print("\n".join(line for line in table.read_text().splitlines() if line.startswith("- ")))
    print(f"Results table: {table} (also .csv and .tex beside it, per-seed values in results_seeds.csv)")
    print(
        f"Every table and figure: {table.parent / REPORT_FILES['index']}; one HTML page: snakemake --report report.html"
    )


def cmd_mlflow_ui(args) -> None:
    from locvit.tracking.ui import serve

    study = None
    if args.study_dir is None:
        params = load_params(args.params, check_models=False)
        args.study_dir, study = StudyLayout.of(params).root, params["study"]
    serve(args.study_dir, args.host, args.port, args.workers, study)


def cmd_mlflow_server(args) -> None:
    from locvit.tracking.server import serve

    if args.study_dir is None:
        args.study_dir = StudyLayout.of(load_params(args.params, check_models=False)).root
    serve(args.study_dir, args.host, args.port, args.workers)


def cmd_launch(args) -> None:
    from locvit.train import launch

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if not rest:
        raise InputError("name the command to run after --, e.g. -- train --run-config ...")
    if args.agent:
        if not args.endpoint or not args.rdzv_id:
            raise launch.LaunchError("--agent needs --endpoint and --rdzv-id")
        code = launch.run_agent(args.nodes, args.gpus_per_node, args.endpoint, args.rdzv_id, rest)
    else:
        code = launch.run_job(args.nodes, args.gpus_per_node, rest)
    raise SystemExit(code)


def cmd_targets(args) -> None:
    from locvit.versioning import stage_targets

    print(
        " ".join(str(t) for t in stage_targets(load_params(args.params, check_models=False), args.stage, args.variant))
    )


def cmd_job_configs(args) -> None:
    from locvit.config.jobs import job_configs, write_job_configs

    params = load_params(args.params, check_models=False)
    written = write_job_configs(params)
    shown = ", ".join(map(str, written[:5])) + (f", ... ({len(written) - 5} more)" if len(written) > 5 else "")
    print(
        f"{len(job_configs(params))} job config(s) of study {params['study']!r} under "
        f"{StudyLayout.of(params).configs}; {len(written)} changed: {shown or 'none'}"
    )


def cmd_dvc_yaml(args) -> None:
    from locvit.io import write_text
    from locvit.versioning import dvc_yaml, model_files

    modules = load_params(args.params, check_models=False)["model_modules"] if args.params.is_file() else []
    text = dvc_yaml(model_files(modules))
    same = args.out.is_file() and args.out.read_text() == text
    if not same:
        write_text(args.out, text)
    print(
        f"{args.out}: {'up to date' if same else 'written'} (from locvit.layout, each stage's imports"
        + (f" and {args.params}'s model_modules)" if modules else ")")
    )


def cmd_pull(args) -> None:
    from locvit.versioning import pull

    pull(str(args.params))


#: Where to report a bug (pyproject.toml names no project URL).
ISSUES = "the locvit issue tracker"
DATA_HELP = "the test split: one file, or one per checkpoint (data.split: per_seed), with as many --manifest"
TRACKING_HELP = "the default MLflow backend, a SQLite file (ignored when MLFLOW_TRACKING_URI is set)"
THREADS_HELP = "torch CPU threads (default: torch's choice)"


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of images, 1 or more")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of points")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="locvit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, fn, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_.replace("%", "%%"), description=help_)  # help is %-formatted
        p.add_argument(
            "--params", type=Path, default=Path("params.yaml"), help="the study config (default params.yaml)"
        )
        p.set_defaults(fn=fn)
        return p

    p = add("validate", cmd_validate, "check params.yaml and say how many runs it defines and what they cost")
    p.add_argument(
        "--cost",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print each variant's runs, epochs, images seen, training FLOPs and GPU-hours (default: on)",
    )
    p.add_argument(
        "--train-images",
        type=_positive_int,
        metavar="N",
        help="the training split's size where the source counts it only when prepared (an image folder: "
        "ImageNet's is 1,281,167 less data.val_fraction's share)",
    )

    p = add("status", cmd_status, "what snakemake -n would re-run in the study, why, and what it costs")
    p.add_argument(
        "--check",
        action="store_true",
        help="for each training run whose code changed, compare the fingerprint it recorded with the code's now",
    )

    p = add("accept", cmd_accept, "keep what jobs made although their code changed, on the record (see status)")
    p.add_argument("jobs", nargs="*", metavar="JOB", help="a job locvit status lists, e.g. 'evaluate mait_b'")
    p.add_argument("--cleared", action="store_true", help="every training job whose runs' fingerprints are equal")
    p.add_argument("--why", required=True, help="why the change keeps the results (recorded with the acceptance)")

    p = add("prepare", cmd_prepare, "split the dataset and write one FFCV file per split plus a manifest")
    p.add_argument(
        "--data-config",
        type=Path,
        help="a JSON file holding the data section at its training fraction (instead of --params)",
    )
    for split in ("train", "val", "test"):
        p.add_argument(f"--{split}", type=Path, required=True, help=f"output .beton of the {split} split")
    p.add_argument("--manifest", type=Path, required=True, help="output JSON manifest")

    add(
        "fetch",
        cmd_fetch,
        "download the study's dataset to where prepare reads it (data.root; CIFAR's archive, MD5 checked) and "
        "nothing else: on a cluster, run it on the login node, where there is a network",
    )

    p = add(
        "train",
        cmd_train,
        "train runs one after another in one process (--run-config: one or a list; "
        "--variant: every seed of a variant); resumes an interrupted run, skips a finished "
        "one; under torchrun, one process per GPU",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--run-config",
        type=Path,
        nargs="+",
        help="JSON files, each a run's resolved config (written by Snakemake, locvit.config.jobs)",
    )
    g.add_argument("--variant", help="train every seed of this variant of --params into --runs-dir/seed<k>")
    p.add_argument("--train-data", type=Path, required=True)
    p.add_argument("--val-data", type=Path, required=True)
    p.add_argument("--manifest", type=Path, required=True)
    p.add_argument(
        "--search-spec",
        type=Path,
        help="with --run-config: a mask-search round's spec.json; trains the run with its masks",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        nargs="+",
        help="with --run-config: where each run's last.pt, best.pt and metrics.json go (one per config)",
    )
    p.add_argument("--runs-dir", type=Path, help="with --variant: parent of the seed<k> folders")
    p.add_argument("--tracking-db", type=Path, required=True, help=TRACKING_HELP)
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--keep-finished",
        action="store_true",
        help="a finished run (last.pt says so) whose metrics.json is gone is restored, not retrained "
        "(a job of several runs that Snakemake re-runs; delete last.pt to retrain one)",
    )
    p.add_argument(
        "--system-metrics-s",
        type=float,
        default=None,
        help="seconds between samples of MLflow's system metrics, 0 for none (default: "
        "$LOCVIT_SYSTEM_METRICS_S, which the workflow sets from tracking.system_metrics_s; else with "
        "--params its tracking.system_metrics_s; else none)",
    )

    p = add("evaluate", cmd_evaluate, "score checkpoints on the test split (one loader for all of them)")
    p.add_argument("--checkpoint", type=Path, nargs="+", required=True, help="checkpoints to score")
    p.add_argument("--out", type=Path, nargs="+", required=True, help="one output JSON per --checkpoint")
    p.add_argument("--data", type=Path, nargs="+", required=True, help=DATA_HELP)
    p.add_argument("--manifest", type=Path, nargs="+", required=True)
    p.add_argument("--tracking-db", type=Path, required=True, help=TRACKING_HELP)
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)

    p = add("analyse", cmd_analyse, "attention analyses (ALS, similarity, rollout, masks) and a profile of checkpoints")
    p.add_argument("--checkpoint", type=Path, nargs="+", required=True, help="checkpoints to analyse")
    p.add_argument("--analysis-config", type=Path, required=True, help="a JSON file holding the analysis section")
    p.add_argument("--json", type=Path, nargs="+", required=True, help="one output JSON per --checkpoint")
    p.add_argument("--npz", type=Path, nargs="+", required=True, help="one output .npz per --checkpoint")
    p.add_argument("--profile", type=Path, help="output JSON of the model's profile (from the first checkpoint)")
    p.add_argument("--data", type=Path, nargs="+", required=True, help=DATA_HELP + "; its first images are analysed")
    p.add_argument("--manifest", type=Path, nargs="+", required=True)
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)

    p = add(
        "throughput",
        cmd_throughput,
        "inference images/s of every variant of --params, measured side by side in "
        "one process in alternating rounds (random weights)",
    )
    p.add_argument(
        "--throughput-config",
        type=Path,
        help="the job's JSON config (locvit.config.jobs; Snakemake's); without it, built from --params",
    )
    p.add_argument("--out", type=Path, required=True, help="output CSV (results/<study>/report/throughput.csv)")
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)

    p = add("search-spec", cmd_search_spec, "derive a MaiT mask-search round's masks from the previous round")
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--search-config", type=Path, required=True, help="a JSON file holding the mask_search section")
    p.add_argument("--previous-spec", type=Path, help="the previous round's spec.json (rounds >= 1)")
    p.add_argument("--previous-analysis", type=Path, help="the previous round's analysis JSON (its ALS)")
    p.add_argument("--out", type=Path, required=True)

    p = add("search-table", cmd_search_table, "the mask search's table: each round's masks, ALS and accuracy")
    p.add_argument(
        "--search-table-config",
        type=Path,
        help="the job's JSON config (locvit.config.jobs; Snakemake's); without it, built from --params",
    )
    p.add_argument("--specs", type=Path, nargs="+", required=True)
    p.add_argument("--analyses", type=Path, nargs="+", required=True)
    p.add_argument("--evals", type=Path, nargs="+", required=True)
    p.add_argument("--md", type=Path, required=True)
    p.add_argument("--json", type=Path, required=True)

    p = add("report", cmd_report, "write the results table, the papers' tables and the figures of a study")
    p.add_argument(
        "--report-config",
        type=Path,
        help="the job's JSON config (locvit.config.jobs; Snakemake's); without it, built from --params. "
        "With it, --params is not read: the file is logged to the study's MLflow run as it is",
    )
    p.add_argument("--study-dir", type=Path, required=True, help="results/<study>: its eval/, runs/, analysis/, maps/")
    p.add_argument("--out-dir", type=Path, required=True, help="where the report goes (results/<study>/report)")
    p.add_argument("--tracking-db", type=Path, required=True, help=TRACKING_HELP)
    p.add_argument(
        "--mlflow",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log each variant's figures to its MLflow runs and link the runs in the tables",
    )
    p.add_argument(
        "--extra-params",
        type=Path,
        nargs="*",
        default=[],
        help="params of other studies (e.g. other data.train_fraction) for the accuracy-vs-fraction figure",
    )
    p.add_argument(
        "--extra-study-dir", type=Path, nargs="*", default=[], help="their results/<study> folders, in order"
    )

    p = add(
        "stats",
        cmd_stats,
        "rebuild a study's results table (results.csv/.md/.tex) from its evaluations.json alone: each run's "
        "score and per-image hits, as a report writes them and benchmarks/results/*/ commit them",
    )
    p.add_argument(
        "evaluations",
        type=Path,
        nargs="+",
        help="an evaluations.json (a report's, or a committed one); several of one study run on different "
        "machines pool into one table, each machine's runs counted as more seeds",
    )
    p.add_argument("--out-dir", type=Path, required=True, help="where the rebuilt table goes")

    p = add(
        "plan",
        cmd_plan,
        "from a finished pilot study's evaluations.json: the seeds per variant and test images each comparison "
        "needs to detect a difference of --delta points with 80 % power at its Holm level",
    )
    p.add_argument("evaluations", type=Path, help="the pilot's evaluations.json (results/<study>/report/)")
    p.add_argument("--delta", type=_positive_float, required=True, help="the difference to detect, in points")

    p = add(
        "sync-tracking",
        cmd_sync_tracking,
        "upload to MLflow the runs whose training could not be tracked "
        "(metrics.json says so, or the backend lacks their run); idempotent",
    )
    p.add_argument(
        "--runs-dir",
        type=Path,
        required=True,
        help="searched at any depth for run folders (results/<study>/runs, or one run's folder)",
    )
    p.add_argument("--tracking-db", type=Path, required=True, help=TRACKING_HELP)
    p.add_argument(
        "--eval-dir",
        type=Path,
        help="test results, <eval-dir>/<variant>/seed<k>.json (default: eval/ beside --runs-dir)",
    )

    p = add("results", cmd_results, "print the study's results table and where it is")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown only")
    p.add_argument("--csv", type=Path, help="render this results.csv (e.g. a committed one) as Markdown instead")

    p = add("mlflow-ui", cmd_mlflow_ui, "open the MLflow UI on a study's runs (its results/<study>/mlflow.db)")
    p.add_argument("--study-dir", type=Path, help="results/<study> holding mlflow.db (default: the study of --params)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to bind (default 127.0.0.1, this machine only; the UI has no login)",
    )
    p.add_argument("--port", type=int, default=5000, help="port to listen on (default 5000)")
    p.add_argument("--workers", type=int, default=1, help="server processes (default 1)")

    p = add(
        "mlflow-server",
        cmd_mlflow_server,
        "serve a study's tracking database to jobs on many nodes "
        "(MLflow's tracking server; a login from MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD)",
    )
    p.add_argument("--study-dir", type=Path, help="results/<study> holding mlflow.db (default: the study of --params)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to bind (default 127.0.0.1, this machine only; any other needs the login)",
    )
    p.add_argument("--port", type=int, default=5000, help="port to listen on (default 5000)")
    p.add_argument("--workers", type=int, default=4, help="server processes (default 4)")

    p = add(
        "launch",
        cmd_launch,
        "inside a SLURM job: run `locvit <command>` as one torchrun per node, joined by "
        "c10d rendezvous on the job's first node (the train rule's launcher for resources.nodes > 1)",
    )
    p.add_argument("--nodes", type=int, required=True, help="nodes (SLURM tasks, one torchrun each)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node: one process each (0: one CPU process)")
    p.add_argument("--agent", action="store_true", help="one node's torchrun (what the job's srun starts on each node)")
    p.add_argument("--endpoint", help="with --agent: the rendezvous HOST:PORT")
    p.add_argument("--rdzv-id", help="with --agent: the rendezvous id (the SLURM job id)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- and the locvit command, e.g. -- train --run-config ...")

    p = add("targets", cmd_targets, "print the Snakemake targets of a DVC stage (dvc.yaml's commands use it)")
    p.add_argument("stage", help="prepare, train, evaluate, analyse or report")
    p.add_argument("variant", nargs="?", help="the variant, for train, evaluate and analyse")

    add(
        "job-configs",
        cmd_job_configs,
        "write each job's resolved part of --params to its file under "
        "results/<study>/config/, where it changed (what Snakemake does at every start)",
    )

    p = add(
        "dvc-yaml",
        cmd_dvc_yaml,
        "write dvc.yaml: its paths from locvit.layout, each stage's code from the imports of its commands "
        "and the files of --params' model_modules (after a change to any)",
    )
    p.add_argument("--out", type=Path, default=Path("dvc.yaml"), help="where to write it (default dvc.yaml)")

    add(
        "pull",
        cmd_pull,
        "dvc pull the study's files, then give them Snakemake's order of times "
        "(snakemake --touch): afterwards snakemake has nothing to do",
    )
    return parser


# Options each of train's two modes needs beyond argparse's own checks.
NEEDED = {
    ("train", "run_config"): ["out_dir"],
    ("train", "variant"): ["runs_dir"],
}


def main(argv: list[str] | None = None) -> int:
    configure_logging()  # every module's messages: stdout, warnings on stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    for (command, mode), needed in NEEDED.items():
        if args.command == command and getattr(args, mode):
            missing = [f"--{n.replace('_', '-')}" for n in needed if getattr(args, n) is None]
            if missing:
                parser.error(f"{command} --{mode.replace('_', '-')}: {' and '.join(missing)} required")
    try:
        args.fn(args)
    except ConfigError as err:
        print(f"locvit: {err}", file=sys.stderr)
        return 2
    except LocvitError as err:  # a user's mistake: one line, no traceback
        print(f"locvit {args.command}: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # its reader closed the pipe (locvit results | head): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0
    except Stopped as err:
        print(
            f"locvit {args.command}: {err}; run it again to resume (exit status {EXIT_STOPPED})",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_STOPPED
    except Exception as err:  # a bug, or a failure below locvit: its traceback follows, from Python
        print(bug_report_line(args.command, err), file=sys.stderr, flush=True)
        raise
    return 0


def bug_report_line(command: str, err: BaseException) -> str:
    """The line printed above an unexpected exception's traceback: what it is and where to report it."""
    from locvit import __version__

    return (
        f"locvit {command}: unexpected {type(err).__name__}, a bug in locvit or a failure below it (numpy, "
        f"torch, timm, FFCV, MLflow, the file system); its traceback follows. Please report it on {ISSUES} with "
        f"the command, this output and locvit {__version__}"
    )


if __name__ == "__main__":
    sys.exit(main())
