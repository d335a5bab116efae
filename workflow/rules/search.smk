# MaiT's ALS-guided mask search (MaiT Sec. 4.2): each round's masks come from the
# previous round's ALS, so the spec of a round is a checkpoint; the round's training
# job takes it as input (through the checkpoint) and trains the base variant with its masks.


checkpoint search_spec:
    input:
        unpack(search_previous),
    output:
        spec=f"{ROUND_DIR}/spec.json",
    params:
        locvit=LOCVIT,
        search=search_config,
        previous=search_previous_args,
    conda:
        ENV
    log:
        f"{LOG_DIR}/search/round{{round}}_spec.log",
    shell:
        "{params.locvit} search-spec --round {wildcards.round} --search-config {params.search:q} {params.previous}"
        " --out {output.spec:q} > {log:q} 2>&1"


rule search_train:
    input:
        train=MAIN_DATA["train"],
        val=MAIN_DATA["val"],
        manifest=MAIN_DATA["manifest"],
        spec=search_spec_file,
    # (last.pt is not an output, as in rule train: a re-run resumes from it)
    output:
        best=f"{ROUND_DIR}/best.pt",
        metrics=f"{ROUND_DIR}/metrics.json",
    params:
        launch=train_launcher,
        base=search_base_config,
        out_dir=f"{ROUND_DIR}",
        tracking_db=TRACKING_DB,
        threads=train_threads,
    group: grouped_with("search_evaluate")  # cluster profile: with search_evaluate (rounds run in turn)
    threads: 1
    resources:
        **TRAIN_RESOURCES,
    conda:
        ENV
    log:
        f"{LOG_DIR}/search/round{{round}}_train.log",
    shell:
        "{params.launch} train --run-config {params.base:q} --search-spec {input.spec:q} --train-data {input.train:q}"
        " --val-data {input.val:q} --manifest {input.manifest:q} --out-dir {params.out_dir:q}"
        " --tracking-db {params.tracking_db:q} --threads {params.threads} > {log:q} 2>&1"


use rule analyse as search_analyse with:
    input:
        checkpoints=f"{ROUND_DIR}/best.pt",
        evaluated=f"{ROUND_DIR}/eval.json",
        test=MAIN_DATA["test"],
        manifest=MAIN_DATA["manifest"],
    output:
        json=f"{ROUND_DIR}/analysis.json",
        npz=f"{ROUND_DIR}/analysis.npz",
        profile=f"{ROUND_DIR}/profile.json",
    log:
        f"{LOG_DIR}/search/round{{round}}_analyse.log",


use rule evaluate as search_evaluate with:
    input:
        checkpoints=f"{ROUND_DIR}/best.pt",
        test=MAIN_DATA["test"],
        manifest=MAIN_DATA["manifest"],
    output:
        f"{ROUND_DIR}/eval.json",
    log:
        f"{LOG_DIR}/search/round{{round}}_evaluate.log",


rule search:
    input:
        specs=search_round_files("spec.json"),
        analyses=search_round_files("analysis.json"),
        evals=search_round_files("eval.json"),
    output:
        md=f"{REPORT_DIR}/mask_search.md",
        json=f"{REPORT_DIR}/mask_search.json",
    params:
        locvit=LOCVIT,
        params_file=PARAMS_FILE,
    conda:
        ENV
    log:
        f"{LOG_DIR}/search/table.log",
    shell:
        "{params.locvit} search-table --params {params.params_file:q} --specs {input.specs:q}"
        " --analyses {input.analyses:q} --evals {input.evals:q} --md {output.md:q} --json {output.json:q}"
        " > {log:q} 2>&1"
