"""Copy a study's report files into the repository (docs/, benchmarks/results/) for readers without its MLflow.

A report's Markdown links each run to the MLflow UI that served the study (``[s0](http://...)``);
a reader of the committed copy has no such server, so in the copy each link becomes the run's
short id as text, the way the report writes runs its backend does not know.

    python -m doctools.publish results/<study>/report docs/<folder> results.md results.csv figures/curves.png ...

(``make sweep`` and ``make efficiency`` call it; ``bench_pipeline.py --demo`` uses :func:`publish`.)
Beside the copies it writes ``source.json``: the commit and the machine that made them (the study ran
right before on this machine), which the docs render beside every table they quote from the folder.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from locvit.io import atomic_path, write_text

RUN_LINK = re.compile(r"\[s\d+\]\([^)]*/runs/([0-9a-f]{32})[^)]*\)")


def unlink_runs(markdown: str) -> str:
    """``[s0](<ui>/#/experiments/1/runs/<id>)`` -> `` `<id[:8]>` ``."""
    return RUN_LINK.sub(lambda m: f"`{m.group(1)[:8]}`", markdown)


def publish(src: Path, dest: Path, names: list[str]) -> list[Path]:
    """Copy ``names`` (paths under ``src``) flat into ``dest``, Markdown without run links; the copies."""
    dest.mkdir(parents=True, exist_ok=True)
    copies = []
    for name in names:
        source, target = src / name, dest / Path(name).name
        if not source.is_file():
            raise FileNotFoundError(f"{source} does not exist: run the study first")
        if source.suffix == ".md":
            write_text(target, unlink_runs(source.read_text()))
        else:
            with atomic_path(target) as tmp:  # a copy cut short leaves the previous file, never half of one
                shutil.copyfile(source, tmp)
        copies.append(target)
    write_source(dest)
    return copies


def write_source(dest: Path) -> Path:
    """``dest/source.json``: the commit and the machine the published files come from."""
    import json

    from benchmarks.common import commit, machine

    path = dest / "source.json"
    write_text(path, json.dumps({"commit": commit(), "machine": machine()}, indent=2) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="the study's report folder")
    parser.add_argument("dest", type=Path, help="where the copies go")
    parser.add_argument("names", nargs="+", help="files under src")
    args = parser.parse_args()
    for path in publish(args.src, args.dest, args.names):
        print(f"published {path}")


if __name__ == "__main__":
    main()
