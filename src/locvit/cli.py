"""The ``locvit`` command line: one subcommand per pipeline step.

Snakemake rules and DVC stages call these with explicit input and output paths.
Two ways to say what to run:

* Snakemake validates ``params.yaml`` once and hands each job exactly its part of
  it (``--data-config`` / ``--run-config``, JSON). A job's command then changes only
  when its own config does, so editing one variant re-runs only that variant.
* DVC stages (and people) give ``--params params.yaml`` with ``--variant`` and
  ``--all-seeds``; the file is validated before anything is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from locvit.config import ConfigError, load_params, run_config, validate_data, validate_run_config


def cmd_validate(args) -> None:
    params = load_params(args.params)
    n = len(params["variants"]) * len(params["seeds"])
    print(f"{args.params}: valid; study {params['study']!r}, {len(params['variants'])} variant(s) x "
          f"{len(params['seeds'])} seed(s) = {n} training run(s)")


def cmd_prepare(args) -> None:
    from locvit.data.prepare import prepare

    data = validate_data(json.loads(args.data_config)) if args.data_config else \
        load_params(args.params, check_models=False)["data"]
    manifest = prepare(data, {"train": args.train, "val": args.val, "test": args.test}, args.manifest)
    sizes = {s: manifest["splits"][s]["size"] for s in manifest["splits"]}
    print(f"prepared {manifest['source']} at {manifest['image_size']}px: {sizes}; data hash {manifest['data_hash']}")


def cmd_train(args) -> None:
    from locvit.train.loop import train_run

    if args.run_config:
        jobs = [(validate_run_config(json.loads(args.run_config)), args.out_dir)]
    else:
        params = load_params(args.params)
        jobs = [(run_config(params, args.variant, s), args.runs_dir / f"seed{s}") for s in params["seeds"]]
    for cfg, out_dir in jobs:
        train_run(cfg, args.train_data, args.val_data, args.manifest, out_dir, args.tracking_db,
                  show_progress=args.progress, threads=args.threads)


def cmd_evaluate(args) -> None:
    from locvit.train.evaluate import evaluate_checkpoints

    if args.all_seeds:
        seeds = load_params(args.params, check_models=False)["seeds"]
        checkpoints = [args.runs_dir / f"seed{s}" / "best.pt" for s in seeds]
        outs = [args.eval_dir / f"seed{s}.json" for s in seeds]
    else:
        checkpoints, outs = args.checkpoint, args.out
    for result in evaluate_checkpoints(checkpoints, outs, args.data, args.manifest, args.tracking_db,
                                       threads=args.threads):
        print(f"{result['variant']} seed {result['seed']}: test top-1 {100 * result['test_top1']:.2f}% "
              f"on {result['n']} images")


def cmd_report(args) -> None:
    from locvit.report.tables import write_tables

    params = load_params(args.params, check_models=False)
    files: list[Path] = []
    for item in args.eval:
        files.extend(sorted(item.rglob("*.json")) if item.is_dir() else [item])
    write_tables(params, files, args.md, args.csv, args.tex, args.summary)
    print(f"results table: {args.md} (also {args.csv}, {args.tex})")


def cmd_results(args) -> None:
    params = load_params(args.params, check_models=False)
    table = Path(params["results_dir"]) / params["study"] / "report" / "results.md"
    if not table.is_file():
        raise FileNotFoundError(f"{table} does not exist yet; run the pipeline first (make demo)")
    print(table.read_text())
    print(f"Results table: {table} (also .csv and .tex beside it)")


TRACKING_HELP = "the default MLflow backend, a SQLite file (ignored when MLFLOW_TRACKING_URI is set)"
THREADS_HELP = "torch CPU threads (default: torch's choice)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="locvit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, fn, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--params", type=Path, default=Path("params.yaml"), help="the study config (default params.yaml)")
        p.set_defaults(fn=fn)
        return p

    add("validate", cmd_validate, "check params.yaml and say how many runs it defines")

    p = add("prepare", cmd_prepare, "split the dataset and write one FFCV file per split plus a manifest")
    p.add_argument("--data-config", help="the data section as JSON (instead of reading it from --params)")
    for split in ("train", "val", "test"):
        p.add_argument(f"--{split}", type=Path, required=True, help=f"output .beton of the {split} split")
    p.add_argument("--manifest", type=Path, required=True, help="output JSON manifest")

    p = add("train", cmd_train, "train one run (--run-config) or every seed of a variant (--variant)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--run-config", help="one run's resolved config as JSON (written by Snakemake)")
    g.add_argument("--variant", help="train every seed of this variant of --params into --runs-dir/seed<k>")
    p.add_argument("--train-data", type=Path, required=True)
    p.add_argument("--val-data", type=Path, required=True)
    p.add_argument("--manifest", type=Path, required=True)
    p.add_argument("--out-dir", type=Path, help="with --run-config: where last.pt, best.pt and metrics.json go")
    p.add_argument("--runs-dir", type=Path, help="with --variant: parent of the seed<k> folders")
    p.add_argument("--tracking-db", type=Path, required=True, help=TRACKING_HELP)
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")

    p = add("evaluate", cmd_evaluate, "score checkpoints on the test split (one loader for all of them)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint", type=Path, nargs="+", help="checkpoints to score")
    g.add_argument("--all-seeds", action="store_true", help="score --runs-dir/seed<k>/best.pt into --eval-dir")
    p.add_argument("--out", type=Path, nargs="+", help="one output JSON per --checkpoint")
    p.add_argument("--runs-dir", type=Path)
    p.add_argument("--eval-dir", type=Path)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--manifest", type=Path, required=True)
    p.add_argument("--tracking-db", type=Path, required=True, help=TRACKING_HELP)
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)

    p = add("report", cmd_report, "write the results table (Markdown, CSV, LaTeX)")
    p.add_argument("--eval", type=Path, nargs="+", required=True, help="evaluation JSON files or folders of them")
    p.add_argument("--md", type=Path, required=True)
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--tex", type=Path, required=True)
    p.add_argument("--summary", type=Path, required=True, help="JSON of test top-1 per variant (DVC metrics)")

    add("results", cmd_results, "print the study's results table and where it is")
    return parser


# Options each mode needs beyond argparse's own checks.
NEEDED = {
    ("train", "run_config"): ["out_dir"],
    ("train", "variant"): ["runs_dir"],
    ("evaluate", "checkpoint"): ["out"],
    ("evaluate", "all_seeds"): ["runs_dir", "eval_dir"],
}


def main(argv: list[str] | None = None) -> int:
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
    except (FileNotFoundError, ValueError) as err:
        print(f"locvit {args.command}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
