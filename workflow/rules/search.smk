# MaiT's ALS-guided mask search (MaiT Sec. 4.2): each round's masks come from the
# previous round's ALS, so the spec of a round is a checkpoint; the round's training
# job takes it as input (through the checkpoint) and trains the base variant with its masks.


checkpoint search_spec:
    input:
        unpack(search_previous),
        config=SEARCH_CONFIG,
    output:
        spec=ROUND["spec"],
    params:
        code=code_digest("search-spec"),  # the source its command runs (locvit.versioning)
        locvit=LOCVIT,
        previous=search_previous_args,
    log:
        f"{LOG_DIR}/search/round{{round}}_spec.log",
    shell:
        "{params.locvit} search-spec --round {wildcards.round} --search-config {input.config:q} {params.previous}"
        " --out {output.spec:q} > {log:q} 2>&1"


rule search_train:
    input:
        train=MAIN_DATA["train"],
        val=MAIN_DATA["val"],
        manifest=MAIN_DATA["manifest"],
        spec=search_spec_file,
        config=SEARCH_TRAIN_CONFIG,  # the base variant's run config; the round's masks come from its spec
    # (last.pt is not an output, as in rule train: a re-run resumes from it)
    output:
        best=str(ROUND_RUN.best),
        metrics=str(ROUND_RUN.metrics),
    params:
        code=code_digest("train"),  # the source its command runs (locvit.versioning)
        claim=gpus.CLAIM,  # a local run on GPUs: the job's own GPUs
        launch=train_launcher,
        out_dir=f"{ROUND_DIR}",
        tracking_db=TRACKING_DB,
    group: grouped_with("search_evaluate")  # cluster profile: with search_evaluate (rounds run in turn)
    threads: 1
    resources:
        **TRAIN_RESOURCES,
    log:
        f"{LOG_DIR}/search/round{{round}}_train.log",
    shell:
        "{params.claim} {params.launch} train --run-config {input.config:q} --search-spec {input.spec:q} --train-data {input.train:q}"
        " --val-data {input.val:q} --manifest {input.manifest:q} --out-dir {params.out_dir:q}"
        " --tracking-db {params.tracking_db:q} --threads {threads} > {log:q} 2>&1"


use rule analyse as search_analyse with:
    input:
        checkpoints=str(ROUND_RUN.best),
        evaluated=ROUND["eval"],
        test=MAIN_DATA["test"],
        manifest=MAIN_DATA["manifest"],
        config=ANALYSE_CONFIG,
    output:
        json=ROUND["analysis"],
        npz=ROUND["maps"],
        profile=ROUND["profile"],
    log:
        f"{LOG_DIR}/search/round{{round}}_analyse.log",


use rule evaluate as search_evaluate with:
    input:
        checkpoints=str(ROUND_RUN.best),
        test=MAIN_DATA["test"],
        manifest=MAIN_DATA["manifest"],
    output:
        ROUND["eval"],
    log:
        f"{LOG_DIR}/search/round{{round}}_evaluate.log",


rule search:
    input:
        specs=search_round_files("spec"),
        analyses=search_round_files("analysis"),
        evals=search_round_files("eval"),
        config=SEARCH_TABLE_CONFIG,  # what it reads of params: the study's name and the search's section
    output:
        md=str(LAYOUT.search_table("md")),
        json=str(LAYOUT.search_table("json")),
    params:
        code=code_digest("search-table"),  # the source its command runs (locvit.versioning)
        locvit=LOCVIT,
    log:
        f"{LOG_DIR}/search/table.log",
    shell:
        "{params.locvit} search-table --search-table-config {input.config:q} --specs {input.specs:q}"
        " --analyses {input.analyses:q} --evals {input.evals:q} --md {output.md:q} --json {output.json:q}"
        " > {log:q} 2>&1"
