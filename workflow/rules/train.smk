# One rule per group of variants with the same seeds (common.smk: seed_set_rules), as the outputs list them.
for name, seeds, variants in seed_set_rules("train"):

    rule:
        name:
            name
        wildcard_constraints:
            variant=variants,
        input:
            unpack(train_data),  # train, val, manifest of the variant's training fraction
            configs=run_configs,  # each run's resolved config
        # last.pt (written every epoch) is deliberately not an output: Snakemake deletes a job's outputs
        # before re-running it, and a re-run (after a kill, a preemption, --rerun-incomplete) resumes from it.
        # One run per job, or a variant's seeds one after another (train_jobs: per_variant).
        output:
            best=train_outputs("best", seeds),
            metrics=train_outputs("metrics", seeds),
        params:
            code=code_digest("train"),  # the source its command runs (locvit.versioning)
            claim=gpus.CLAIM,  # a local run on GPUs: the job's own GPUs
            launch=train_launcher,
            out_dirs=run_dirs,
            keep=keep_finished,
            tracking_db=TRACKING_DB,
        group: grouped_with("evaluate", alone_if_side_by_side=True)  # cluster profile: with evaluate
        threads: 1
        resources:
            **TRAIN_RESOURCES,
        log:
            f"{LOG_DIR}/train/{{variant}}.log" if TRAIN_PER_VARIANT else f"{LOG_DIR}/train/{{variant}}/seed{{seed}}.log",
        shell:
            "{params.claim} {params.launch} train --run-config {input.configs:q} --train-data {input.train:q}"
            " --val-data {input.val:q} --manifest {input.manifest:q} --out-dir {params.out_dirs:q} --tracking-db {params.tracking_db:q} --threads {threads} {params.keep} > {log:q} 2>&1"



for name, seeds, variants in seed_set_rules("evaluate"):

    rule:
        name:
            name
        wildcard_constraints:
            variant=variants,
        input:
            unpack(test_data),
            checkpoints=variant_checkpoints,
        output:
            expand(EVAL_FILE, seed=seeds, allow_missing=True),
        params:
            code=code_digest("evaluate"),  # the source its command runs (locvit.versioning)
            locvit=LOCVIT,
            tracking_db=TRACKING_DB,
        threads: 1
        log:
            str(LAYOUT.log_file("evaluate", "{variant}")),
        shell:
            "{params.locvit} evaluate --checkpoint {input.checkpoints:q}"
            " --out {output:q} --data {input.test:q} --manifest {input.manifest:q}"
            " --tracking-db {params.tracking_db:q} --threads {threads} > {log:q} 2>&1"
