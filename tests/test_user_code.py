"""A study's own model code (params' ``model_modules``) is provenance like locvit's own.

The code digest of every rule that builds a model holds the user's modules and the user's modules they
import, by module name and content, never by place (:func:`locvit.versioning.code_digest`), and a
checkpoint records the code of its model (``model_code``), refusing to load after it changed
(:mod:`locvit.checkpoint`). End to end, through Snakemake and ``locvit evaluate``: tests/test_family_plugin.py.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import timm
import torch

import locvit.models  # registers locvit's families
from locvit.checkpoint import CODE_KEY, DIGEST_KEY, content_digest, load_checkpoint, model_code, save_checkpoint
from locvit.errors import InputError
from locvit.model_modules import bytes_digest, module_files, source_digest
from locvit.versioning import MODEL_COMMANDS, code_digest

# A user's family beside params.yaml: a helper file beside it, a package of its own, and imports of the
# standard library, installed packages and locvit (none of them the user's).
STUDY_FILES = {
    "my_family.py": "import json\nimport torch\nfrom timm.layers import Attention\n"
    "from locvit.models.family import register_family\nfrom pool_helper import pool\n"
    "import myfams.vit\nfrom timm.models import register_model\n\n\ndef forward(x):\n    return pool(x)\n\n\n"
    "@register_model\ndef my_vit(**kwargs):\n    return torch.nn.Linear(3, 2)\n",
    "pool_helper.py": "def pool(x):\n    return x.mean(1)  # (B, C)\n",
    "myfams/__init__.py": "",
    "myfams/vit.py": "from . import blocks\nfrom .blocks import Block\n",
    "myfams/blocks.py": "class Block:\n    pass\n",
    "unused.py": "NOT_IMPORTED = True\n",
}


def study(root: Path) -> Path:
    for name, text in STUDY_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_users_modules_are_found_by_name_with_the_users_modules_they_import(tmp_path, monkeypatch):
    monkeypatch.chdir(study(tmp_path))
    files = module_files(["my_family", "absent_family"])
    assert list(files) == ["absent_family", "my_family", "myfams", "myfams.blocks", "myfams.vit", "pool_helper"]
    assert files["absent_family"] is None and files["pool_helper"] == tmp_path / "pool_helper.py"
    assert files["myfams"] == tmp_path / "myfams" / "__init__.py"  # the package Python runs first


def test_packages_of_another_environment_on_the_path_are_not_a_users_code(tmp_path, monkeypatch):
    """A site-packages reached by PYTHONPATH or a .pth file (a cluster's module system, a venv seeing another's
    packages) holds installed packages: not walked as a user's code (it once walked all of torch, minutes)."""
    other = tmp_path / "env" / "lib" / "python3" / "site-packages"
    (other / "extlib").mkdir(parents=True)
    (other / "extlib" / "__init__.py").write_text("import json\n")
    monkeypatch.syspath_prepend(str(other))
    monkeypatch.chdir(study(tmp_path / "study"))
    (tmp_path / "study" / "uses_ext.py").write_text("import extlib\nimport pool_helper\n")
    assert list(module_files(["uses_ext"])) == ["pool_helper", "uses_ext"]


def test_the_digest_of_a_model_rule_follows_the_users_code_not_its_place(tmp_path, monkeypatch):
    """The user's modules a job runs count in its digest; the same files elsewhere give the same digests; a
    change to the family's helper (its pooling) changes them all. (Which jobs run them: test_code_identity.py.)"""
    here = study(tmp_path / "here")
    monkeypatch.chdir(here)
    modules = ["my_family"]
    before = {c: code_digest(c, model_modules=modules) for c in MODEL_COMMANDS}
    assert all(before[c] != code_digest(c) for c in MODEL_COMMANDS)
    moved = shutil.copytree(here, tmp_path / "elsewhere" / "study")
    monkeypatch.chdir(moved)
    assert {c: code_digest(c, model_modules=modules) for c in MODEL_COMMANDS} == before
    edit(moved / "pool_helper.py", "x.mean(1)", "x.amax(1)")
    after = {c: code_digest(c, model_modules=modules) for c in MODEL_COMMANDS}
    assert all(after[c] != before[c] for c in MODEL_COMMANDS)
    # locvit's digest, then each of the user's modules by name: Snakemake's reason shows which one changed
    assert [part.split("=")[0] for part in after["train"].split()] == [
        code_digest("train"),
        "my_family",
        "myfams",
        "myfams.blocks",
        "myfams.vit",
        "pool_helper",
    ]
    assert set(after["train"].split()) ^ set(before["train"].split()) == {
        p for p in (before["train"] + " " + after["train"]).split() if p.startswith("pool_helper=")
    }
    edit(moved / "myfams" / "blocks.py", "pass", "depth = 2")  # a module of the user's package
    again = {c: code_digest(c, model_modules=modules) for c in MODEL_COMMANDS}
    assert all(again[c] != after[c] for c in MODEL_COMMANDS)
    (moved / "unused.py").write_text("CHANGED = True\n")  # imported by nothing the study names
    assert {c: code_digest(c, model_modules=modules) for c in MODEL_COMMANDS} == again


@pytest.fixture
def trained(tmp_path, monkeypatch) -> tuple[Path, dict]:
    """A checkpoint of a run of the user's family (imported, as a job has), written in the study's folder."""
    monkeypatch.chdir(study(tmp_path / "study"))
    for name in ("my_family", "pool_helper", "myfams", "myfams.vit", "myfams.blocks"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # this test's files, not an earlier test's
    locvit.models.import_modules(["my_family"])
    state = {
        "model": {"head.weight": torch.ones(2, 3)},
        "epoch": 0,
        "weights": "model",
        "config": {"model": "my_vit", "model_kwargs": {}, "model_modules": ["my_family"]},
    }
    path = tmp_path / "study" / "results" / "best.pt"
    save_checkpoint(path, state)
    return path, state


def test_a_checkpoint_records_the_code_of_its_model(trained):
    path, state = trained
    recorded = torch.load(path, weights_only=True)[CODE_KEY]
    assert sorted(recorded) == ["my_family", "myfams", "myfams.blocks", "myfams.vit", "pool_helper"]
    assert recorded["pool_helper"] == source_digest(Path("pool_helper.py"))
    loaded = load_checkpoint(path)
    assert loaded.keys() == state.keys() and torch.equal(loaded["model"]["head.weight"], state["model"]["head.weight"])


def test_a_checkpoint_loads_into_the_same_code_elsewhere(trained, tmp_path, monkeypatch):
    path, _ = trained
    moved = shutil.copytree(path.parents[1], tmp_path / "moved" / "study")
    monkeypatch.chdir(moved)
    assert load_checkpoint(moved / "results" / "best.pt")["epoch"] == 0


def test_a_checkpoint_of_changed_model_code_is_refused_naming_the_module(trained):
    path, _ = trained
    edit(Path("pool_helper.py"), "x.mean(1)", "x.amax(1)")  # the pooling: mean -> max
    with pytest.raises(InputError, match=r"trained with other model code: pool_helper changed since") as err:
        load_checkpoint(path)
    assert "\n" not in str(err.value) and f"--forcerun {path}" in str(err.value)
    assert "allow_code_change=True" in str(err.value)
    assert load_checkpoint(path, allow_code_change=True)["epoch"] == 0  # on purpose
    Path("my_family.py").unlink()
    with pytest.raises(InputError, match=r"my_family \(missing\), pool_helper changed"):
        load_checkpoint(path)


def test_a_checkpoint_written_before_it_recorded_its_code_loads_as_before(trained):
    path, state = trained
    torch.save({**state, DIGEST_KEY: content_digest(state)}, path)  # as save_checkpoint wrote it before model_code
    edit(Path("pool_helper.py"), "x.mean(1)", "x.amax(1)")
    assert load_checkpoint(path).keys() == state.keys()


def test_a_locvit_family_records_its_family_file_and_timms_models_record_nothing():
    name = timm.list_models("mait_*")[0]
    mait = Path(locvit.models.__file__).parent / "mait.py"
    assert model_code({"model": name}) == {"locvit.models.mait": source_digest(mait)}
    assert model_code({"model": "deit_tiny_patch16_224"}) == {}  # timm's own (an installed package)


def test_a_checkpoint_that_recorded_its_code_by_bytes_loads_until_the_code_changes(trained):
    """Before 29/34 a checkpoint recorded each module by its file's bytes: the same files still match it."""
    path, state = trained
    by_bytes = {name: bytes_digest(file) for name, file in module_files(["my_family"]).items()}
    torch.save({**state, CODE_KEY: by_bytes, DIGEST_KEY: content_digest({**state, CODE_KEY: by_bytes})}, path)
    assert load_checkpoint(path)["epoch"] == 0
    edit(Path("pool_helper.py"), "x.mean(1)", "x.amax(1)")
    with pytest.raises(InputError, match="pool_helper changed since"):
        load_checkpoint(path)
