"""locvit: the study pipeline, prepare -> train (variant x seed) -> evaluate -> analyse -> report,
every variant's throughput measured side by side after all training, plus MaiT's mask search when
the study has a mask_search section.

The study config is params.yaml (another file: --config params=path/to/study.yaml).
It is validated against locvit's schema (src/locvit/config/params.schema.yaml) before any job runs.
"""

from snakemake.utils import min_version

min_version("9.27.1")  # the Snakemake the test suite runs; an older one stops here, saying so

from locvit.config import load_params


PARAMS_FILE = config.get("params", "params.yaml")
P = load_params(PARAMS_FILE)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analyse.smk"
include: "workflow/rules/throughput.smk"
include: "workflow/rules/search.smk"
include: "workflow/rules/report.smk"


onsuccess:
    from locvit.versioning import commit_after_snakemake
    from locvit.tracking.run import untracked

    # --config dvc_commit=false (dvc.yaml's stages) arrives as YAML's false, or as the string "false"
    print(f"DVC: {commit_after_snakemake(PARAMS_FILE, str(config.get('dvc_commit', True)).lower() != 'false')}")
    if notice := untracked(LAYOUT.root, TRACKING_DB):  # runs trained while the tracking backend did not answer
        print(notice)


onerror:
    from locvit.tracking.run import untracked

    if notice := untracked(LAYOUT.root, TRACKING_DB):
        print(notice)


rule all:
    input:
        report_files(),
        search_files(),
    default_target: True
