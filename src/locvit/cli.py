"""The ``locvit`` command line: one subcommand per pipeline step.

Snakemake rules and DVC stages call these with explicit input and output paths;
every subcommand validates ``params.yaml`` first, so a bad config stops before
anything is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from locvit.config import ConfigError, load_params, run_config


def _seeds(args, params) -> list[int]:
    return params["seeds"] if args.all_seeds else [args.seed]


def cmd_validate(args) -> None:
    params = load_params(args.params)
    n = len(params["variants"]) * len(params["seeds"])
    print(f"{args.params}: valid; study {params['study']!r}, {len(params['variants'])} variant(s) x "
          f"{len(params['seeds'])} seed(s) = {n} training run(s)")


def cmd_prepare(args) -> None:
    from locvit.data.prepare import prepare

    params = load_params(args.params, check_models=False)
    manifest = prepare(params["data"], {"train": args.train, "val": args.val, "test": args.test}, args.manifest)
    sizes = {s: manifest["splits"][s]["size"] for s in manifest["splits"]}
    print(f"prepared {manifest['source']} at {manifest['image_size']}px: {sizes}; data hash {manifest['data_hash']}")


def cmd_tracking(args) -> None:
    from locvit import tracking
    from locvit.io import write_json

    params = load_params(args.params, check_models=False)
    experiment_id = tracking.setup(params["study"], args.study_dir)
    write_json(args.out, {"experiment": params["study"], "experiment_id": experiment_id,
                          "tracking_uri": tracking.default_uri(args.study_dir)})
    print(f"MLflow experiment {params['study']!r} ({experiment_id}) at {tracking.default_uri(args.study_dir)}")


def cmd_train(args) -> None:
    from locvit.train.loop import train_run

    params = load_params(args.params)
    for seed in _seeds(args, params):
        out_dir = args.out_dir if not args.all_seeds else args.runs_dir / f"seed{seed}"
        train_run(run_config(params, args.variant, seed), args.train_data, args.val_data, args.manifest,
                  out_dir, args.study_dir, show_progress=args.progress, threads=args.threads)


def cmd_evaluate(args) -> None:
    from locvit.train.evaluate import evaluate_checkpoint

    params = load_params(args.params, check_models=False)
    if args.all_seeds:
        jobs = [(args.runs_dir / f"seed{s}" / "best.pt", args.eval_dir / f"seed{s}.json") for s in params["seeds"]]
    else:
        jobs = [(args.checkpoint, args.out)]
    for checkpoint, out in jobs:
        result = evaluate_checkpoint(checkpoint, args.data, args.manifest, out, args.study_dir, threads=args.threads)
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
    for split in ("train", "val", "test"):
        p.add_argument(f"--{split}", type=Path, required=True, help=f"output .beton of the {split} split")
    p.add_argument("--manifest", type=Path, required=True, help="output JSON manifest")

    p = add("tracking", cmd_tracking, "create the study's MLflow experiment (before jobs log to it in parallel)")
    p.add_argument("--study-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="output JSON naming the experiment and backend")

    p = add("train", cmd_train, "train one variant at one seed (or all seeds)")
    p.add_argument("--variant", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--seed", type=int)
    g.add_argument("--all-seeds", action="store_true", help="train every seed of params.yaml into --runs-dir/seed<k>")
    p.add_argument("--train-data", type=Path, required=True)
    p.add_argument("--val-data", type=Path, required=True)
    p.add_argument("--manifest", type=Path, required=True)
    p.add_argument("--out-dir", type=Path, help="with --seed: where last.pt, best.pt and metrics.json go")
    p.add_argument("--runs-dir", type=Path, help="with --all-seeds: parent of the seed<k> folders")
    p.add_argument("--study-dir", type=Path, required=True, help="results/<study> (holds the default MLflow backend)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")

    p = add("evaluate", cmd_evaluate, "score a checkpoint on the test split")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint", type=Path)
    g.add_argument("--all-seeds", action="store_true", help="score --runs-dir/seed<k>/best.pt into --eval-dir")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--manifest", type=Path, required=True)
    p.add_argument("--out", type=Path)
    p.add_argument("--runs-dir", type=Path)
    p.add_argument("--eval-dir", type=Path)
    p.add_argument("--study-dir", type=Path, required=True)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")

    p = add("report", cmd_report, "write the results table (Markdown, CSV, LaTeX)")
    p.add_argument("--eval", type=Path, nargs="+", required=True, help="evaluation JSON files or folders of them")
    p.add_argument("--md", type=Path, required=True)
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--tex", type=Path, required=True)
    p.add_argument("--summary", type=Path, required=True, help="JSON of test top-1 per variant (DVC metrics)")

    add("results", cmd_results, "print the study's results table and where it is")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "all_seeds", False):
        needed = {"train": ["runs_dir"], "evaluate": ["runs_dir", "eval_dir"]}[args.command]
    else:
        needed = {"train": ["out_dir"], "evaluate": ["out"]}.get(args.command, [])
    missing = [f"--{n.replace('_', '-')}" for n in needed if getattr(args, n) is None]
    if missing:
        parser.error(f"{args.command}: {' and '.join(missing)} required here")
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
