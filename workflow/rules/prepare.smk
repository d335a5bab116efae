rule prepare:
    output:
        train=f"{DATA_DIR}/train.beton",
        val=f"{DATA_DIR}/val.beton",
        test=f"{DATA_DIR}/test.beton",
        manifest=f"{DATA_DIR}/manifest.json",
    params:
        locvit=LOCVIT,
        params_file=PARAMS_FILE,
        data=data_config,
    conda:
        ENV
    log:
        f"{LOG_DIR}/prepare.log",
    shell:
        "{params.locvit} prepare --params {params.params_file:q} --train {output.train:q} --val {output.val:q}"
        " --test {output.test:q} --manifest {output.manifest:q} > {log:q} 2>&1"


rule tracking:
    output:
        f"{STUDY_DIR}/tracking.json",
    params:
        locvit=LOCVIT,
        params_file=PARAMS_FILE,
        study_dir=study_dir_of,
    conda:
        ENV
    log:
        f"{LOG_DIR}/tracking.log",
    shell:
        "{params.locvit} tracking --params {params.params_file:q} --study-dir {params.study_dir:q} --out {output:q}"
        " > {log:q} 2>&1"
