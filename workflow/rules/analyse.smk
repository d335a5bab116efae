# analyse runs after its variant's evaluate (their input: its results): in a cluster group job the
# two then come one after the other, and the group asks for one job's GPU and CPUs, not both.
for name, seeds, variants in seed_set_rules("analyse"):

    rule:
        name:
            name
        wildcard_constraints:
            variant=variants,
        input:
            unpack(test_data),
            checkpoints=variant_checkpoints,
            evaluated=expand(EVAL_FILE, seed=seeds, allow_missing=True),
            config=ANALYSE_CONFIG,
        output:
            json=expand(ANALYSIS_FILE, seed=seeds, allow_missing=True),
            npz=expand(MAPS_FILE, seed=seeds, allow_missing=True),
            profile=PROFILE_FILE,
        params:
            code=code_digest("analyse"),  # the source its command runs (locvit.versioning)
            locvit=LOCVIT,
        threads: 1
        log:
            str(LAYOUT.log_file("analyse", "{variant}")),
        shell:
            "{params.locvit} analyse --checkpoint {input.checkpoints:q} --analysis-config {input.config:q}"
            " --json {output.json:q} --npz {output.npz:q} --profile {output.profile:q} --data {input.test:q}"
            " --manifest {input.manifest:q} --threads {threads} > {log:q} 2>&1"
