# Every variant's images/s, measured side by side in one process (locvit.analysis.throughput), alone:
# locally it takes every core Snakemake has, so nothing runs beside it, and it waits for every training
# run (their metrics as input; ancient: a retrained variant is the same model, and needs no new measurement);
# on the cluster the profile gives it a node of its own (--exclusive).
rule throughput:
    input:
        trained=ancient(metrics_files),
        config=THROUGHPUT_CONFIG,  # what it reads of params: rounds, batch, repeats; the models and the baseline
    output:
        csv=THROUGHPUT_FILE,
    params:
        code=code_digest("throughput"),  # the source its command runs (locvit.versioning)
        locvit=LOCVIT,
    threads: every_core
    log:
        str(LAYOUT.log_file("throughput")),
    shell:
        "{params.locvit} throughput --throughput-config {input.config:q} --out {output.csv:q}"
        " --threads {threads} > {log:q} 2>&1"
