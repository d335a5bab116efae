"""Where the files of a study live: the one module that knows ``<results_dir>/<study>/``'s layout.

``data/`` (and ``data_<pct>pct/`` per training fraction): the FFCV files and manifest.json;
``runs/<variant>/seed<k>/``: last.pt, best.pt, metrics.json, mlflow_run.json; ``eval/``, ``analysis/``,
``maps/<variant>/seed<k>``: test score, attention analysis (and profile.json), arrays; ``search/round<r>/``;
``config/``: each job's resolved part of params.yaml; ``report/``; ``logs/``; ``mlflow.db``, ``mlartifacts/``.
The rules, the CLI, the report and tracking ask this module; ``dvc.yaml`` spells the same folders
(``tests/test_layout.py``). A variant or seed may be a Snakemake wildcard (``"{variant}"``): methods format it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "val", "test")
#: The report's files (``report/``) by their role, and its folders (tables and figures per name, PDFs,
#: one metrics file per variant).
REPORT_FILES = {
    "md": "results.md",
    "csv": "results.csv",
    "seeds": "results_seeds.csv",
    "tex": "results.tex",
    "summary": "summary.json",
    "evaluations": "evaluations.json",  # what results.csv is computed from (locvit stats rebuilds it)
    "index": "index.md",
    "record": "report.json",
}
REPORT_FOLDERS = ("tables", "figures", "pdf", "metrics")
#: The mask search's table in ``report/`` (Snakemake only), and a round's files beside its run's.
SEARCH_TABLE = {"md": "mask_search.md", "json": "mask_search.json"}
ROUND_FILES = {
    "spec": "spec.json",
    "eval": "eval.json",
    "analysis": "analysis.json",
    "maps": "analysis.npz",
    "profile": "profile.json",
}
TRACKING_DB = "mlflow.db"
#: The environment variable the workflow hands the study's params file in, for the report to log to MLflow as
#: it is. Not a rule param: the same study started with another path to its params file re-runs nothing
#: (the report reads its job config; what it logs is a copy for the reader).
STUDY_PARAMS_ENV = "LOCVIT_STUDY_PARAMS"
ARTIFACTS = "mlartifacts"  # beside the tracking database


@dataclass(frozen=True)
class RunFiles:
    """The files of one training run's folder (``runs/<variant>/seed<k>/``).

    ``last`` is written after every epoch (what a resume reads), ``best`` holds the best
    epoch's weights (what evaluation and analysis read), ``metrics`` the run's history and
    result (its MLflow spool while the backend is unreachable), ``record`` the MLflow run a
    run killed before its first epoch started (so its restart reopens that run).
    """

    folder: Path

    LAST = "last.pt"
    BEST = "best.pt"
    METRICS = "metrics.json"
    RECORD = "mlflow_run.json"

    @classmethod
    def at(cls, folder: str | Path) -> RunFiles:
        return cls(Path(folder))

    @property
    def last(self) -> Path:
        return self.folder / self.LAST

    @property
    def best(self) -> Path:
        return self.folder / self.BEST

    @property
    def metrics(self) -> Path:
        return self.folder / self.METRICS

    @property
    def record(self) -> Path:
        return self.folder / self.RECORD

    def all(self) -> tuple[Path, ...]:
        return self.last, self.best, self.metrics, self.record


def seed_name(seed: int | str) -> str:
    """``seed<k>``: a run's folder, or the stem of its per-seed files."""
    return f"seed{seed}"


def artifacts_beside(db: str | Path) -> Path:
    """The artifact store of a SQLite tracking database: ``mlartifacts/`` in the same folder."""
    return Path(db).parent / ARTIFACTS


@dataclass(frozen=True)
class StudyLayout:
    """The folders and files of one study under ``root`` (``<results_dir>/<study>``).

    ``fraction`` is the study's ``data.train_fraction``: runs at that fraction read
    ``data/``, runs at any other ``data_<pct>pct/``; with ``per_seed`` (``data.split``) seed k's ``seed<k>/`` in it.
    """

    root: Path
    fraction: float | None = None
    per_seed: bool = False

    @classmethod
    def of(cls, params: dict) -> StudyLayout:
        """The layout of a validated params.yaml (``locvit.config.load_params``)."""
        data = params["data"]
        return cls(
            Path(params["results_dir"]) / params["study"], data["train_fraction"], data.get("split") == "per_seed"
        )

    # data ------------------------------------------------------------------------------------

    def data_name(self, fraction: float | None = None, seed: int | str | None = None) -> str:
        """``data`` at the study's own fraction (or none given), ``data_<pct>pct`` at another; ``/seed<k>`` in it
        for seed k's split when the study draws one per seed."""
        name = "data" if fraction is None or fraction == self.fraction else f"data_{round(100 * fraction)}pct"
        return f"{name}/seed{seed}" if self.per_seed and seed is not None else name

    def data_dir(self, fraction: float | None = None) -> Path:
        return self.root / self.data_name(fraction)

    def data_files(
        self, fraction: float | None = None, name: str | None = None, seed: int | str | None = None
    ) -> dict[str, Path]:
        """The prepared files at a training fraction and seed (or in the data folder ``name``): ``train``,
        ``val``, ``test`` (.beton) and ``manifest``."""
        folder = self.root / (name or self.data_name(fraction, seed))
        return {split: folder / f"{split}.beton" for split in SPLITS} | {"manifest": folder / "manifest.json"}

    # runs and what is computed from them -------------------------------------------------------

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def runs_dir(self, variant: str) -> Path:
        """The folder holding every seed's run folder of a variant."""
        return self.runs / variant

    def run_dir(self, variant: str, seed: int | str) -> Path:
        return self.runs_dir(variant) / seed_name(seed)

    def run_files(self, variant: str, seed: int | str) -> RunFiles:
        """The files of one run's folder (``RunFiles``)."""
        return RunFiles.at(self.run_dir(variant, seed))

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    def eval_dir(self, variant: str) -> Path:
        return self.eval / variant

    def eval_file(self, variant: str, seed: int | str) -> Path:
        return self.eval_dir(variant) / f"{seed_name(seed)}.json"

    @property
    def analysis(self) -> Path:
        return self.root / "analysis"

    def analysis_dir(self, variant: str) -> Path:
        return self.analysis / variant

    def analysis_file(self, variant: str, seed: int | str) -> Path:
        return self.analysis_dir(variant) / f"{seed_name(seed)}.json"

    def profile_file(self, variant: str) -> Path:
        return self.analysis_dir(variant) / "profile.json"

    @property
    def maps(self) -> Path:
        return self.root / "maps"

    def maps_dir(self, variant: str) -> Path:
        return self.maps / variant

    def maps_file(self, variant: str, seed: int | str) -> Path:
        return self.maps_dir(variant) / f"{seed_name(seed)}.npz"

    # the rest ----------------------------------------------------------------------------------

    @property
    def search(self) -> Path:
        return self.root / "search"

    def search_round(self, r: int | str) -> Path:
        return self.search / f"round{r}"

    def round_file(self, r: int | str, role: str) -> Path:
        """A round's spec, test result, analysis, maps or profile (``ROUND_FILES``); its run's files are
        ``RunFiles.at(search_round(r))``."""
        return self.search_round(r) / ROUND_FILES[role]

    def search_table(self, ext: str) -> Path:
        return self.report / SEARCH_TABLE[ext]

    # each job's config (locvit.config.jobs) --------------------------------------------------

    @property
    def configs(self) -> Path:
        return self.root / "config"

    def job_config(self, job: str, name: str | None = None) -> Path:
        """``config/<job>.json``, or ``config/<job>/<name>.json`` for a job with one per data folder."""
        return self.configs / job / f"{name}.json" if name else self.configs / f"{job}.json"

    def train_configs(self, variant: str) -> Path:
        """The folder of a variant's run configs, one per seed."""
        return self.configs / "train" / variant

    def train_config(self, variant: str, seed: int | str) -> Path:
        return self.train_configs(variant) / f"{seed_name(seed)}.json"

    @property
    def report(self) -> Path:
        return self.root / "report"

    def report_file(self, role: str) -> Path:
        """A file of the report (``REPORT_FILES``: ``md``, ``csv``, ``seeds``, ...) or one of its folders."""
        return self.report / (REPORT_FILES.get(role) or REPORT_FOLDERS[REPORT_FOLDERS.index(role)])

    @property
    def throughput_file(self) -> Path:
        """Every variant's images/s, measured side by side by the study's one throughput job (CSV)."""
        return self.report / "throughput.csv"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log_file(self, step: str, name: str | None = None) -> Path:
        """A job's log: ``logs/<step>/<name>.log`` (per data folder or variant), or ``logs/<step>.log``."""
        return self.logs / step / f"{name}.log" if name else self.logs / f"{step}.log"

    @property
    def accepted_code(self) -> Path:
        """The code changes the user accepted (``locvit accept``): per job, its new code and the code it ran with."""
        return self.root / "accepted_code.json"

    @property
    def tracking_db(self) -> Path:
        """The default MLflow backend, a SQLite file (``MLFLOW_TRACKING_URI`` overrides it)."""
        return self.root / TRACKING_DB

    @property
    def artifacts(self) -> Path:
        return artifacts_beside(self.tracking_db)


def per_seed(folder: str | Path, seeds, suffix: str) -> list[Path]:
    """``<folder>/seed<k><suffix>`` for each seed (``suffix`` ``""`` names run folders)."""
    return [Path(folder) / f"{seed_name(s)}{suffix}" for s in seeds]
