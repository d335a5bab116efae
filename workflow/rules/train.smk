rule train:
    input:
        train=rules.prepare.output.train,
        val=rules.prepare.output.val,
        manifest=rules.prepare.output.manifest,
    # last.pt (written every epoch) is deliberately not an output: Snakemake deletes a job's outputs
    # before re-running it, and a re-run (after a kill, a preemption, --rerun-incomplete) resumes from it.
    output:
        best=f"{RUNS_DIR}/{{variant}}/seed{{seed}}/best.pt",
        metrics=f"{RUNS_DIR}/{{variant}}/seed{{seed}}/metrics.json",
    params:
        launch=train_launcher,
        run=run_config_json,
        out_dir=f"{RUNS_DIR}/{{variant}}/seed{{seed}}",
        tracking_db=TRACKING_DB,
        threads=train_threads,
    threads: 1
    resources:
        gpu=0,
    conda:
        ENV
    log:
        f"{LOG_DIR}/train/{{variant}}/seed{{seed}}.log",
    shell:
        "{params.launch} train --run-config {params.run:q} --train-data {input.train:q}"
        " --val-data {input.val:q} --manifest {input.manifest:q} --out-dir {params.out_dir:q} --tracking-db {params.tracking_db:q} --threads {params.threads} > {log:q} 2>&1"


rule evaluate:
    input:
        checkpoints=variant_checkpoints,
        test=rules.prepare.output.test,
        manifest=rules.prepare.output.manifest,
    output:
        [f"{EVAL_DIR}/{{variant}}/seed{seed}.json" for seed in SEEDS],
    params:
        locvit=LOCVIT,
        tracking_db=TRACKING_DB,
    threads: 1
    conda:
        ENV
    log:
        f"{LOG_DIR}/evaluate/{{variant}}.log",
    shell:
        "{params.locvit} evaluate --checkpoint {input.checkpoints:q}"
        " --out {output:q} --data {input.test:q} --manifest {input.manifest:q}"
        " --tracking-db {params.tracking_db:q} --threads {threads} > {log:q} 2>&1"
