rule train:
    input:
        train=rules.prepare.output.train,
        val=rules.prepare.output.val,
        manifest=rules.prepare.output.manifest,
        tracking=rules.tracking.output[0],
    output:
        best=f"{RUNS_DIR}/{{variant}}/seed{{seed}}/best.pt",
        last=f"{RUNS_DIR}/{{variant}}/seed{{seed}}/last.pt",
        metrics=f"{RUNS_DIR}/{{variant}}/seed{{seed}}/metrics.json",
    params:
        locvit=LOCVIT,
        params_file=PARAMS_FILE,
        run=run_config_json,
        out_dir=f"{RUNS_DIR}/{{variant}}/seed{{seed}}",
        study_dir=study_dir_of,
    threads: 1
    conda:
        ENV
    log:
        f"{LOG_DIR}/train/{{variant}}/seed{{seed}}.log",
    shell:
        "{params.locvit} train --params {params.params_file:q} --variant {wildcards.variant:q} --seed {wildcards.seed}"
        " --train-data {input.train:q} --val-data {input.val:q} --manifest {input.manifest:q}"
        " --out-dir {params.out_dir:q} --study-dir {params.study_dir:q} --threads {threads} > {log:q} 2>&1"


rule evaluate:
    input:
        checkpoint=rules.train.output.best,
        test=rules.prepare.output.test,
        manifest=rules.prepare.output.manifest,
        tracking=rules.tracking.output[0],
    output:
        f"{EVAL_DIR}/{{variant}}/seed{{seed}}.json",
    params:
        locvit=LOCVIT,
        params_file=PARAMS_FILE,
        study_dir=study_dir_of,
    threads: 1
    conda:
        ENV
    log:
        f"{LOG_DIR}/evaluate/{{variant}}/seed{{seed}}.log",
    shell:
        "{params.locvit} evaluate --params {params.params_file:q} --checkpoint {input.checkpoint:q} --data {input.test:q}"
        " --manifest {input.manifest:q} --out {output:q} --study-dir {params.study_dir:q} --threads {threads}"
        " > {log:q} 2>&1"
