rule prepare:
    output:
        train=DATA_FILES["train"],
        val=DATA_FILES["val"],
        test=DATA_FILES["test"],
        manifest=DATA_FILES["manifest"],
    params:
        locvit=LOCVIT,
        data=data_config,
    conda:
        ENV
    log:
        f"{LOG_DIR}/prepare/{{datadir}}.log",
    shell:
        "{params.locvit} prepare --data-config {params.data:q} --train {output.train:q} --val {output.val:q}"
        " --test {output.test:q} --manifest {output.manifest:q} > {log:q} 2>&1"

