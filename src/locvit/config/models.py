"""What params.yaml says about models, checked against the models themselves, and remembered.

``check_model`` builds a variant's model on the meta device: a registered timm model, built with its keywords
at the data's image size (``locvit.models.create``), passing its family's ``check`` (Swin's and Twins'
windows), with a patch size that divides the image. ``claiming_family`` answers choices from params alone
(the default ``baseline``). Importing timm costs seconds in every ``snakemake -n``, so answers are cached,
keyed by their inputs, timm's and torch's versions and the code of ``locvit.models`` and the study's
``model_modules``; failures are never cached.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import inspect
import json
import re
from importlib.metadata import version
from pathlib import Path

from locvit.io import cache_file, remember
from locvit.model_modules import working_dir_on_path

MODELS_DIR = Path(__file__).parent / "models"


def model_cache_file(kind: str, key: list, modules: list[str] = (), code: list[Path] = ()) -> Path:
    """The cache file of ``key``: its hash with timm's and torch's versions and the models' code (locvit's,
    ``modules``', and any other file in ``code`` that computes the answer)."""
    code = [*sorted(MODELS_DIR.glob("*.py")), *code]
    for module in modules:  # a module outside locvit: its code too
        with working_dir_on_path():
            try:
                spec = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                spec = None
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            code.append(Path(spec.origin))
    return cache_file(kind, [key, version("timm"), version("torch"), list(modules)], code)


def check_model(name: str, variant: dict, image_size: int, num_classes: int, modules: list[str] = ()) -> list[str]:
    """The problems of variant ``name``'s model (``variant``: its ``model`` and ``kwargs``), built on meta.

    ``modules``: params' ``model_modules``, imported first. A passing check is remembered.
    """
    stamp = model_cache_file("model-checks", [variant["model"], variant["kwargs"], image_size, num_classes], modules)
    if stamp.exists():
        return []
    problems = _build_model(name, variant, image_size, num_classes, modules)
    if not problems:
        remember(stamp, "")
    return problems


def _build_model(name: str, variant: dict, image_size: int, num_classes: int, modules: list[str] = ()) -> list[str]:
    import timm
    import torch

    from locvit import models  # registers locvit's families

    try:
        models.import_modules(modules)
    except ImportError as err:
        return [f"model_modules: {err}"]
    model = variant["model"]
    if not timm.is_model(model):
        close = difflib.get_close_matches(model, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `timm.list_models()`"
        return [f"variants.{name}.model: {model!r} is not a registered timm model{hint}"]
    try:
        with torch.device("meta"):
            built = models.create(
                {
                    "model": model,
                    "model_kwargs": {"img_size": image_size, "num_classes": num_classes, **variant["kwargs"]},
                }
            )
    except Exception as err:  # any build failure is a config problem of this variant
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(err)) if isinstance(err, TypeError) else None
        close = difflib.get_close_matches(unknown[1], _taken(model, image_size, num_classes), n=1) if unknown else []
        if close:
            return [
                f"variants.{name}.kwargs.{unknown[1]}: {model} takes no keyword argument {unknown[1]!r}; "
                f"did you mean {close[0]!r}?"
            ]
        return [
            f"variants.{name}.kwargs: {model} does not build with {variant['kwargs']} at img_size={image_size} "
            f"(img_size goes only to models that take it): {err}"
        ]
    from locvit.models.family import family_of

    problems = family_of(built).check(built)  # e.g. Swin's windows that do not divide a stage's grid
    if problems:
        return [f"variants.{name}.kwargs: {model} at img_size={image_size}: {p}" for p in problems]
    # timm's patch embedding builds with any patch size and fails only at the first forward. (Only its
    # non-overlapping one, which has a grid: PVT v2's overlapping 7-px patches stride by 4.)
    embed = getattr(built, "patch_embed", None)
    patch = getattr(embed, "patch_size", None)
    if (
        isinstance(patch, tuple)
        and hasattr(embed, "grid_size")
        and not getattr(embed, "dynamic_img_pad", False)
        and image_size % patch[0]
    ):
        return [
            f"variants.{name}.kwargs.patch_size: {patch[0]} does not divide data.image_size {image_size}; "
            f"choose a patch size that divides the image"
        ]
    return []


def _taken(model: str, image_size: int, num_classes: int) -> list[str]:
    """The keyword arguments the class of ``model`` takes (its ``__init__``'s and its bases'), from a build
    on meta with the pipeline's own arguments only; none when that does not build either."""
    import torch

    from locvit import models

    try:
        with torch.device("meta"):
            built = models.create(
                {"model": model, "model_kwargs": {"img_size": image_size, "num_classes": num_classes}}
            )
    except Exception:
        return []
    return sorted(
        {
            p.name
            for cls in type(built).__mro__
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        }
    )


def claiming_family(model: str, modules: list[str] = ()) -> dict | None:
    """``{"family": name, "baseline": bool}`` of the family that claims the timm model name ``model``
    (``locvit.models.family.family_claiming``; ``modules``: params' ``model_modules``), or None.
    Remembered, so a study whose models were asked about before imports no timm."""
    path = model_cache_file("model-families", [model], modules)
    with contextlib.suppress(OSError, ValueError):  # missing, unreadable or corrupt: asked again
        found = json.loads(path.read_text())
        if found is None or (isinstance(found, dict) and set(found) == {"family", "baseline"}):
            return found
    from locvit import models
    from locvit.models.family import family_claiming

    try:
        models.import_modules(modules)
    except ImportError:
        return None  # the model check names the module that does not import
    family = family_claiming(model)
    found = {"family": family.name, "baseline": family.baseline} if family else None
    remember(path, json.dumps(found))
    return found


def code_modules(variant: dict, image_size: int, num_classes: int, modules: list[str] = ()) -> list[str] | None:
    """The modules, locvit's family files or a user's (``modules``: params' ``model_modules``), whose code a
    variant's model runs: the module that registered its timm name, and the modules of the family that claims
    the name and of the family its built model belongs to (``family_of``, as the analyses pick it). None when
    the model does not build: the caller then counts every family. Remembered like ``check_model``."""
    key = [variant["model"], variant["kwargs"], image_size, num_classes]
    path = model_cache_file("model-families", ["code", *key], modules)
    with contextlib.suppress(OSError, ValueError):  # missing, unreadable or corrupt: asked again
        found = json.loads(path.read_text())
        if isinstance(found, list) and all(isinstance(m, str) for m in found):
            return found
    import sys

    import timm

    from locvit.model_modules import user_code
    from locvit.models.family import family_claiming, family_module, family_of

    if check_model("", variant, image_size, num_classes, modules):  # remembered: validate asked it already
        return None
    import torch

    from locvit import models

    with torch.device("meta"):
        built = models.create(
            {
                "model": variant["model"],
                "model_kwargs": {"img_size": image_size, "num_classes": num_classes, **variant["kwargs"]},
            }
        )
    found = {timm.models.model_entrypoint(variant["model"]).__module__, family_module(family_of(built))}
    if (claimed := family_claiming(variant["model"])) is not None:
        found.add(family_module(claimed))
    mine = set()
    for name in found:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and (name.split(".")[0] == "locvit" or user_code(name, Path(file))):
            mine.add(name)
    remember(path, json.dumps(sorted(mine)))
    return sorted(mine)
