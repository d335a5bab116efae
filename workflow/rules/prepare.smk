rule prepare:
    output:
        train=f"{STUDY_DIR}/{{datadir}}/train.beton",
        val=f"{STUDY_DIR}/{{datadir}}/val.beton",
        test=f"{STUDY_DIR}/{{datadir}}/test.beton",
        manifest=f"{STUDY_DIR}/{{datadir}}/manifest.json",
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

