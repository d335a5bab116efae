rule analyse:
    input:
        unpack(test_data),
        checkpoints=variant_checkpoints,
    output:
        json=[f"{ANALYSIS_DIR}/{{variant}}/seed{seed}.json" for seed in SEEDS],
        npz=[f"{MAPS_DIR}/{{variant}}/seed{seed}.npz" for seed in SEEDS],
        profile=f"{ANALYSIS_DIR}/{{variant}}/profile.json",
    params:
        locvit=LOCVIT,
        analysis=analysis_config,
    threads: 1
    conda:
        ENV
    log:
        f"{LOG_DIR}/analyse/{{variant}}.log",
    shell:
        "{params.locvit} analyse --checkpoint {input.checkpoints:q} --analysis-config {params.analysis:q}"
        " --json {output.json:q} --npz {output.npz:q} --profile {output.profile:q} --data {input.test:q}"
        " --manifest {input.manifest:q} --threads {threads} > {log:q} 2>&1"
