# Every variant's images/s, measured side by side in one process (locvit.analysis.throughput), alone:
# locally it takes every core Snakemake has, so nothing runs beside it, and it waits for every training
# run (their metrics as input; ancient: a retrained variant is the same model, and needs no new measurement);
# on the cluster the profile gives it a node of its own (--exclusive).
rule throughput:
    input:
        trained=ancient(metrics_files),
    output:
        csv=THROUGHPUT_FILE,
    params:
        locvit=LOCVIT,
        params_file=PARAMS_FILE,
        analysis=throughput_config,  # params triggers: rounds, batch, repeats; the models and the baseline
        models=throughput_models,
        baseline=P["baseline"],
    threads: every_core
    conda:
        ENV
    log:
        f"{LOG_DIR}/throughput.log",
    shell:
        "{params.locvit} throughput --params {params.params_file:q} --out {output.csv:q}"
        " --threads {threads} > {log:q} 2>&1"
