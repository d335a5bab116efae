"""What the report reads from one finished study, keyed by its job config's variants and seeds.

The report job's config (``locvit.config.jobs.report_config``) names the study, its baseline and margin, and
per variant its model, seeds and fraction; nothing else of params.yaml is read. The files (``locvit.layout``):
each run's test score, per-epoch history and attention analysis, and each variant's profile. A file the study
defines but that is absent is recorded as missing, never replaced by a number; a file that is not valid JSON,
or that names another run, is an error.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from locvit.errors import InputError
from locvit.io import read_json, read_throughput, unpack_bits
from locvit.layout import StudyLayout
from locvit.report import stats

DATASET_NAMES = {"digits": "Digits", "cifar10": "CIFAR10", "cifar100": "CIFAR100", "imagenet": "ImageNet"}


def _display(family: str) -> str:
    """A registered family's display name (a profile written before profiles carried it), else its name."""
    from locvit import models  # noqa: F401  registers locvit's families
    from locvit.models.family import family_named

    known = family_named(family)
    return known.display if known else family


@functools.cache
def _family_of(model: str, kwargs_json: str, modules: tuple[str, ...]) -> tuple[str, str]:
    """(name, display name) of a model's family, built on the meta device (no memory, no compute)."""
    import torch

    from locvit import models
    from locvit.models.family import family_of

    with torch.device("meta"):
        built = models.create({"model": model, "model_kwargs": json.loads(kwargs_json), "model_modules": list(modules)})
    family = family_of(built)
    return family.name, family.display


@functools.cache
def _extras(family: str, modules: tuple[str, ...]) -> tuple:
    """The extras a family declares (``locvit.models.family.Extra``), its module among ``modules`` or locvit's."""
    from locvit import models
    from locvit.models.family import family_named

    models.import_modules(modules)
    known = family_named(family)
    return known.extras if known else ()


@dataclass(frozen=True)
class ExtraFigure:
    """An ``Extra`` as a profile records it: what the report draws, without the model code that reads it."""

    name: str
    shape: str
    title: str
    caption: str
    limits: tuple[float, float] | None = None
    pdf: bool = False


def missing_text(variant: str, seeds: list[int], what: str = "") -> str:
    """``missing: mait_soft seed 1`` / ``missing: lsa profile`` (what names a non-seed file)."""
    if what:
        return f"missing: {variant} {what}"
    return f"missing: {variant} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


@dataclass
class Acc:
    """Test top-1 (%) of one variant over its seeds, and (in tables that compare) its comparison with a reference.

    ``test`` compares it with the reference (``against``); ``p_holm``, ``p_equivalent_holm``,
    ``mde``, ``equivalence_bound``, ``verdict``, ``within_margin`` and ``family`` are set once per
    study (``Study.comparisons``: one Holm family per reference), so every table that shows a
    comparison shows the same numbers.
    """

    variant: str
    values: dict[int, float]  # seed -> test top-1 in %
    run_ids: dict[int, str]  # seed -> MLflow run id (of the runs found)
    missing: list[int]  # seeds the study defines whose evaluation file is absent
    n_images: int | None = None  # test images each seed was scored on (None: unknown or unequal)
    hits: np.ndarray | None = None  # (images, seeds) per-image top-1 right/wrong, seeds in sorted order
    test_split: dict[str, str | None] = field(default_factory=dict)  # eval file -> the test_hash it records
    unpaired: str | None = None  # why a comparison with per-image results on both sides is not paired
    seed_splits: dict[int, str | None] = field(default_factory=dict)  # seed -> its test_hash (data.split: per_seed)
    resample: float | None = None  # the seeds' mean n_test / n_train there (stats.resampled)
    reference: str | None = None  # the variant compared with
    test: stats.Comparison | None = None
    p_holm: float | None = None
    p_equivalent_holm: float | None = None
    mde: float | None = None  # the smallest difference the comparison could detect (80 % power)
    verdict: str | None = None  # stats.VERDICTS; None: not in a comparison
    equivalence_bound: float | None = None  # the smallest margin it could show equivalence within
    within_margin: bool = False  # better/worse, and also shown inside ± margin
    family: str | None = None  # its Holm family, "against <reference>"
    family_size: int | None = None  # the comparisons with a p in that family (Holm's m)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def summary(self) -> stats.Summary | None:
        if not self.values:
            return None
        return stats.describe(
            [self.values[s] for s in sorted(self.values)],
            self.n_images,
            None if self.seed_splits else self.hits,
            self.resample,
        )

    @property
    def mean(self) -> float | None:
        return self.summary.mean if self.values else None

    @property
    def std(self) -> float | None:
        return self.summary.std if self.values else None

    @property
    def delta(self) -> float | None:
        return self.test.delta if self.test else None

    def against(self, base: Acc | None, margin: float) -> Acc:
        """This cell compared with ``base`` (none when either has no values): paired over the test images
        when both have per-image results and every evaluation file of both records the same test split
        (``test_hash``: its content in the order scored); else unpaired, with ``unpaired`` saying why."""
        test, why = None, None
        if base is not None and base.n and self.n and base.variant != self.variant and self.resample and base.resample:
            test, why = self._per_seed(base, margin)
        elif base is not None and base.n and self.n and base.variant != self.variant:
            same = self.n_images is not None and self.n_images == base.n_images
            hits = (self.hits, base.hits) if same and self.hits is not None and base.hits is not None else None
            if hits is not None and (why := split_difference({**self.test_split, **base.test_split})):
                why, hits = f"{self.variant} vs {base.variant}: not paired over the test images: {why}", None
            test = stats.compare(
                [self.values[s] for s in sorted(self.values)],
                [base.values[s] for s in sorted(base.values)],
                margin,
                self.n_images if same else None,
                hits,
            )
        return replace(
            self,
            reference=base.variant if test else None,
            test=test,
            p_holm=None,
            p_equivalent_holm=None,
            mde=None,
            verdict=None,
            equivalence_bound=None,
            within_margin=False,
            family=None,
            family_size=None,
            unpaired=why,
        )

    def _per_seed(self, base: Acc, margin: float) -> tuple[stats.Comparison, str | None]:
        """The comparison where seeds had their own splits (``stats.resampled``): paired on the seeds both ran on
        the same split when there are two or more, else each side's corrected variance added, saying why."""
        common = [s for s in sorted(self.values) if s in base.values and self.seed_splits[s] == base.seed_splits[s]]
        left = sorted((set(self.values) | set(base.values)) - set(common))
        head = f"{self.variant} vs {base.variant}: "
        if len(common) >= 2:
            a, b = [self.values[s] for s in common], [base.values[s] for s in common]
            why = (
                f"{head}seed(s) {', '.join(map(str, left))} left out: not run on the same split by both"
                if left
                else None
            )
            return stats.compare(a, b, margin, resample=self.resample), why
        a, b = [self.values[s] for s in sorted(self.values)], [base.values[s] for s in sorted(base.values)]
        why = f"{head}not paired by seed: fewer than 2 seeds on the same split (each side's error added)"
        return stats.compare(a, b, margin, resample=(self.resample, base.resample)), why


def split_difference(files: dict[str, str | None]) -> str | None:
    """None when every evaluation file (path -> its ``test_hash``) scored the same test split; else which
    files differ (grouped by hash) or lack the record, as a sentence."""
    groups: dict[str | None, list[str]] = {}
    for path, digest in files.items():
        groups.setdefault(digest, []).append(path)
    if len(groups) == 1 and None not in groups:
        return None
    parts = [
        f"{', '.join(paths)} scored test split {digest[:12]}" for digest, paths in groups.items() if digest is not None
    ]
    if None in groups:
        parts.append(
            f"{', '.join(groups[None])} record no test split (test_hash; written by an older locvit: "
            "re-run the evaluation)"
        )
    return "; ".join(parts) + " (the unpaired form is used)"


@dataclass
class Variant:
    """The files of one variant, by seed; ``None`` / absent keys where a file is missing."""

    name: str
    model: str
    description: str
    recipe: dict  # the training recipe's keys the tables show (locvit.config.jobs.REPORT_RECIPE_KEYS)
    seeds: list[int]
    fraction: float = 1.0  # the fraction of the training split it trained on
    base: str = ""  # the variant it is a training-fraction copy of (itself when not)
    model_kwargs: dict = field(default_factory=dict)  # what the model is built with (its run config's)
    model_modules: list = field(default_factory=list)  # params' model_modules (families outside locvit)
    evals: dict[int, dict] = field(default_factory=dict)
    eval_files: dict[int, str] = field(default_factory=dict)  # seed -> its evaluation file, relative to the study
    metrics: dict[int, dict] = field(default_factory=dict)
    analyses: dict[int, dict] = field(default_factory=dict)
    npz: dict[int, Path] = field(default_factory=dict)
    profile: dict | None = None

    @property
    def arch(self) -> dict | None:
        return self.profile.get("arch") if self.profile else None

    @property
    def family(self) -> str:
        """The family's name (``locvit.models.family``): from the profile, else from the model built on meta."""
        return self.arch["family"] if self.arch else self._family()[0]

    @property
    def display(self) -> str:
        """The family's display name (``MaiT``, ``DeiT``, ...)."""
        if self.arch:
            return self.arch.get("display") or _display(self.arch["family"])
        return self._family()[1]

    @property
    def extras(self) -> tuple:
        """The analysis outputs its family declares beyond the common ones: as its profile lists them (no
        model is imported), else from the family (``locvit.models.family.Extra``)."""
        if self.arch and "extras" in self.arch:
            return tuple(
                ExtraFigure(**{**e, "limits": e["limits"] and tuple(e["limits"])}) for e in self.arch["extras"]
            )
        return _extras(self.family, tuple(self.model_modules))

    @property
    def no_locality(self) -> str | None:
        """Why its analyses hold no ALS or distance, where that is so: ``no attention layers`` (a CNN), the
        attention layers no family reads, or no map over the patch grid; None where they hold one, or
        where nothing was analysed (then the analysis is missing, which the tables say)."""
        analyses = list(self.analyses.values())
        if not analyses or any(a.get("als_mean") is not None or a.get("mad_mean") is not None for a in analyses):
            return None
        if all(not a.get("layers") for a in analyses):
            unread = sorted({c for a in analyses for c in a.get("unread_attention") or []})
            return (
                f"no attention layers read ({', '.join(unread)}: no family reads them)"
                if unread
                else "no attention layers"
            )
        return "no attention maps over the patch grid"

    def _family(self) -> tuple[str, str]:
        return _family_of(self.model, json.dumps(self.model_kwargs, sort_keys=True), tuple(self.model_modules))

    def acc(self) -> Acc:
        seeds = sorted(self.evals)
        sizes = {self.evals[s]["n"] for s in seeds if "n" in self.evals[s]}
        n_images = sizes.pop() if len(sizes) == 1 and all("n" in self.evals[s] for s in seeds) else None
        hits, splits = None, {s: self.evals[s].get("test_hash") for s in seeds}
        per_seed = bool(seeds) and all(self.evals[s].get("data_split") == "per_seed" for s in seeds)
        if seeds and n_images and all(self.evals[s].get("test_hits") for s in seeds):
            hits = np.stack([self._hits(s, n_images) for s in seeds], axis=1)  # (images, seeds)
        known = per_seed and all(self.evals[s].get("n") and self.evals[s].get("n_train") for s in seeds)
        resample = float(np.mean([self.evals[s]["n"] / self.evals[s]["n_train"] for s in seeds])) if known else None
        return Acc(
            self.name,
            {s: 100.0 * self.evals[s]["test_top1"] for s in seeds},
            {s: e["mlflow_run_id"] for s, e in self.evals.items() if e.get("mlflow_run_id")},
            [s for s in self.seeds if s not in self.evals],
            n_images,
            hits,
            {self.eval_files.get(s, f"{self.name} seed {s}"): self.evals[s].get("test_hash") for s in seeds},
            seed_splits=splits if per_seed else {},
            resample=resample,
        )

    def _hits(self, seed: int, n_images: int) -> np.ndarray:
        try:
            return unpack_bits(self.evals[seed]["test_hits"], n_images)
        except ValueError as err:
            raise InputError(
                f"evaluation file of {self.name} seed {seed}: test_hits: {err}; re-run its "
                "evaluation (delete the file and run the pipeline)"
            ) from err

    def run_ids(self) -> dict[int, str]:
        """Seed -> MLflow run id, from whichever of the run's files is present."""
        ids = {}
        for seed in self.seeds:
            for source in (self.evals, self.metrics, self.analyses):
                if source.get(seed, {}).get("mlflow_run_id"):
                    ids[seed] = source[seed]["mlflow_run_id"]
                    break
        return ids

    def n_params(self) -> int | None:
        if self.profile:
            return self.profile["params"]
        return next((e["n_params"] for e in self.evals.values()), None)

    def missing(self, files: dict) -> list[int]:
        return [s for s in self.seeds if s not in files]


def size_key(arch: dict) -> tuple:
    """A model's size as the MaiT grids group it: (embed_dim, depth, num_heads, patch_size)."""
    return arch["embed_dim"], arch["depth"], arch["num_heads"], arch.get("patch_size")


def masked(arch: dict) -> bool:
    """Whether a profile's architecture has at least one masked head (a MaiT grid's cell)."""
    mask = arch.get("mask")
    return bool(mask and sum(mask["heads_per_layer"]) > 0)


@dataclass
class Study:
    """A finished study's files, and its comparisons (``comparisons``): each (variant, reference) is
    computed once and belongs to one Holm family, the comparisons against that reference."""

    config: dict  # the report's job config (locvit.config.jobs.report_config)
    dir: Path
    variants: dict[str, Variant]
    throughput: dict[str, dict] | None = None  # report/throughput.csv by variant (the throughput job), if written

    @property
    def name(self) -> str:
        return self.config["study"]

    @property
    def baseline(self) -> str | None:
        """The variant the others are compared with (params' ``baseline``), if the study has it."""
        name = self.config["baseline"]
        return name if name in self.variants else None

    def reference(self, v: Variant) -> Variant | None:
        """What ``v`` is compared with: the baseline trained on ``v``'s fraction of the data (a
        data-efficiency study), else the baseline."""
        if not self.baseline:
            return None
        base = self.variants[self.baseline].base
        same = [u for u in self.variants.values() if u.base == base and u.fraction == v.fraction]
        return same[0] if same else self.variants[self.baseline]

    def size_reference(self, v: Variant) -> Variant | None:
        """What a MaiT grid compares ``v`` with: DeiT of ``v``'s size (by profile), its own reference when
        that is one, else one trained on the same fraction, else any (the first by name)."""
        if not v.arch:
            return None
        same = sorted(
            (
                u
                for u in self.variants.values()
                if u.arch and u.arch["family"] == "deit" and size_key(u.arch) == size_key(v.arch)
            ),
            key=lambda u: (u.fraction != v.fraction, u.name),
        )
        ref = self.reference(v)
        return ref if ref is not None and ref.name in {u.name for u in same} else (same[0] if same else None)

    def pairs(self) -> list[tuple[str, str]]:
        """Every (variant, reference) a table of the report shows: each variant against its reference (the
        results table, the papers' tables, data efficiency), and each masked MaiT against DeiT of its size
        (MaiT's grids) where that is another variant."""
        out = []
        for v in self.variants.values():
            ref = self.reference(v)
            if ref is not None and ref.name != v.name:
                out.append((v.name, ref.name))
        for v in self.variants.values():
            if v.arch and v.arch["family"] == "mait" and masked(v.arch):
                ref = self.size_reference(v)
                if ref is not None and (v.name, ref.name) not in out:
                    out.append((v.name, ref.name))
        return out

    @functools.cached_property
    def comparisons(self) -> dict[tuple[str, str], Acc]:
        """(variant, reference) -> the variant's Acc compared with the reference, for every pair of
        ``pairs``: Holm's correction over each reference's comparisons (one family per reference,
        over the whole study), then each one's minimum detectable effect and smallest provable
        equivalence margin at Holm's strictest level (alpha / m) and its verdict."""
        accs = {name: v.acc() for name, v in self.variants.items()}
        out = {(v, r): accs[v].against(accs[r], self.margin) for v, r in self.pairs()}
        families: dict[str, list[tuple[str, str]]] = {}
        for key, acc in out.items():
            if acc.test is not None:
                families.setdefault(key[1], []).append(key)
        for ref, keys in families.items():
            tests = [out[k].test for k in keys]
            p_holm, p_eq = stats.holm([t.p for t in tests]), stats.holm([t.p_equivalent for t in tests])
            m = sum(t.p is not None for t in tests)
            level = stats.ALPHA / m if m else None
            for k, t, p, q in zip(keys, tests, p_holm, p_eq):
                tested = t.p is not None
                out[k] = replace(
                    out[k],
                    p_holm=p,
                    p_equivalent_holm=q,
                    mde=stats.mde(t.se, t.df, level) if tested else None,
                    equivalence_bound=stats.equivalence_bound(t.delta, t.se, t.df, level) if tested else None,
                    verdict=stats.verdict(t.delta, p, q),
                    within_margin=stats.within_margin(p, q),
                    family=f"against {ref}",
                    family_size=m,
                )
        return out

    def compared(self, v: Variant, ref: Variant) -> Acc:
        """``v`` compared with ``ref``: the study's one set of numbers for that pair (``comparisons``)."""
        try:
            return self.comparisons[(v.name, ref.name)]
        except KeyError:
            raise KeyError(
                f"{v.name} against {ref.name} is not among the study's comparisons "
                "(Study.pairs lists what the tables compare)"
            ) from None

    @property
    def margin(self) -> float:
        """The equivalence margin in points (params' ``equivalence_margin``)."""
        return float(self.config["equivalence_margin"])

    def acc(self, v: Variant) -> Acc:
        """``v``'s test top-1, compared with its reference's (uncompared for the reference itself)."""
        ref = self.reference(v)
        if ref is None or ref.name == v.name:
            return v.acc()
        return self.compared(v, ref)

    @property
    def fraction_protocol(self) -> str:
        """How its training fractions were trained (params' ``fraction_protocol``)."""
        return self.config.get("fraction_protocol", "same_epochs")

    @property
    def fractions(self) -> list[float]:
        return sorted({v.fraction for v in self.variants.values()})

    @property
    def train_fraction(self) -> float:
        return float(self.config["data"]["train_fraction"])

    @property
    def dataset(self) -> str:
        """The dataset as a table column names it, e.g. ``CIFAR10`` or ``ImageNet (25% train)``."""
        source = self.config["data"]["source"]
        name = DATASET_NAMES.get(source, source)
        return name if self.train_fraction >= 1 else f"{name} ({100 * self.train_fraction:g}% train)"


#: What each fraction_protocol means, as a caption says it.
PROTOCOL_TEXT = {
    "same_epochs": "every fraction trains the recipe's epochs, so smaller fractions also take fewer optimiser steps",
    "same_images": "every fraction sees about as many images as a full run: epochs × 1/f with the warm-up scaled "
    "alike (ConViT's rule)",
}


def _read_run_file(path: Path, what: str, variant: str, seed: int | None) -> dict | None:
    if not path.is_file():
        return None
    data = read_json(path, what, "Re-run the step that writes it.")
    if data.get("variant", variant) != variant or (seed is not None and int(data.get("seed", seed)) != seed):
        raise InputError(
            f"{what} {path} belongs to variant {data.get('variant')!r} seed {data.get('seed')!r}, "
            f"not {variant!r} seed {seed!r}; it was copied to the wrong place"
        )
    return data


def load_study(config: dict, study_dir: str | Path) -> Study:
    """Read every result file of the config's variants and seeds that exists (``config``: the report's job
    config, ``locvit.config.jobs.report_config``)."""
    study_dir = Path(study_dir)
    layout = StudyLayout(study_dir)
    variants = {}
    for name in config["order"]:  # params.yaml's order: the tables' rows
        v = variants[name] = _variant(name, config["variants"][name])
        for seed in v.seeds:
            if e := _read_run_file(layout.eval_file(name, seed), "evaluation file", name, seed):
                v.evals[seed] = e
                v.eval_files[seed] = layout.eval_file(name, seed).relative_to(study_dir).as_posix()
            metrics = layout.run_files(name, seed).metrics
            if m := _read_run_file(metrics, "training metrics", name, seed):
                v.metrics[seed] = m
            if a := _read_run_file(layout.analysis_file(name, seed), "analysis file", name, seed):
                v.analyses[seed] = a
            if (npz := layout.maps_file(name, seed)).is_file():
                v.npz[seed] = npz
        v.profile = _read_run_file(layout.profile_file(name), "profile", name, None)
    throughput = read_throughput(layout.throughput_file) if layout.throughput_file.is_file() else None
    return Study(config, study_dir, variants, throughput)


def _variant(name: str, spec: dict) -> Variant:
    """A variant of the report config, no file read yet."""
    return Variant(
        name,
        spec["model"],
        spec["description"],
        spec["recipe"],
        list(spec["seeds"]),
        spec["train_fraction"],
        spec["base"],
        spec["model_kwargs"],
        spec["model_modules"],
    )


#: What evaluations.json keeps of each evaluation file: what results.csv is computed from.
EVAL_KEYS = (
    "data_split",
    "variant",
    "seed",
    "test_top1",
    "val_top1",
    "n",
    "n_train",
    "test_hash",
    "test_hits",
    "mlflow_run_id",
    "n_params",
)


def evaluations(study: Study) -> dict:
    """The study's results table in a few kB: its report config, each run's test score with its per-image hits
    (packed bits) and each variant's params and architecture; ``study_from_evaluations`` reads it back."""
    return {
        "config": study.config,
        "variants": {
            name: {
                "profile": {k: v.profile[k] for k in ("params", "arch") if k in v.profile} if v.profile else None,
                "evals": {str(seed): {k: e[k] for k in EVAL_KEYS if k in e} for seed, e in sorted(v.evals.items())},
            }
            for name, v in study.variants.items()
        },
    }


def study_from_evaluations(*paths: Path) -> Study:
    """The study an evaluations.json holds (``evaluations``), enough for its results table.

    Several files of one study run on different machines (the same variants, seeds and test images; e.g. the
    demo on AVX-512 and AVX2 kernels) pool into one: each machine's run of a seed is one more run, numbered
    ``1000 * k + seed`` for the k-th file, and the test images stay paired. That assumes no machine effect
    (``tables.machines_markdown`` tests it) and runs of one seed on two machines as apart as two seeds."""
    studies = []
    for path in paths:
        data = read_json(path, "evaluations file", "Give the evaluations.json a report wrote.")
        try:
            config, variants = data["config"], {}
            for name in config["order"]:
                v = variants[name] = _variant(name, config["variants"][name])
                saved = data["variants"][name]
                v.evals = {int(seed): e for seed, e in saved["evals"].items()}
                v.eval_files = {seed: f"{path}: {name} seed {seed}" for seed in v.evals}
                v.profile = saved["profile"]
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(
                f"{path} is not an evaluations.json of this locvit ({err!r} missing or malformed)"
            ) from err
        studies.append(Study(config, path.parent, variants))
    first = studies[0]
    if len(studies) > 1 and any(
        e.get("data_split") == "per_seed" for s in studies for v in s.variants.values() for e in v.evals.values()
    ):
        raise InputError(
            "a study with a split per seed (data.split: per_seed) does not pool: another machine's run of seed k "
            "repeats seed k's split, which the corrected resampled t would count as a new one"
        )
    for path, other in zip(paths[1:], studies[1:]):
        if list(other.variants) != list(first.variants):
            raise InputError(f"{path}: variants {list(other.variants)} differ from {paths[0]}'s: cannot pool them")
    for k, other in enumerate(studies[1:], start=1):
        for name, v in other.variants.items():
            pooled = first.variants[name]
            pooled.seeds += [1000 * k + s for s in v.seeds]
            pooled.evals.update({1000 * k + s: e for s, e in v.evals.items()})
            pooled.eval_files.update({1000 * k + s: f for s, f in v.eval_files.items()})
    return first
