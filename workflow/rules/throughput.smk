# Every variant's images/s, measured side by side in one process (locvit.analysis.throughput), alone:
# locally it takes every core Snakemake has, so nothing runs beside it; on the cluster the profile gives it a
# node of its own (--exclusive). It measures models at random weights, so it takes no training output: a
# retrained variant needs no new measurement, and a change to its code (its own param) is seen even when a
# training job upstream re-runs too (Snakemake checks a job's own triggers only when no input re-runs).
rule throughput:
    input:
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
