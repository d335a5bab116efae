rule prepare:
    output:
        train=f"{DATA_DIR}/train.beton",
        val=f"{DATA_DIR}/val.beton",
        test=f"{DATA_DIR}/test.beton",
        manifest=f"{DATA_DIR}/manifest.json",
    params:
        locvit=LOCVIT,
        data=data_config,
    conda:
        ENV
    log:
        f"{LOG_DIR}/prepare.log",
    shell:
        "{params.locvit} prepare --data-config {params.data:q} --train {output.train:q} --val {output.val:q}"
        " --test {output.test:q} --manifest {output.manifest:q} > {log:q} 2>&1"

