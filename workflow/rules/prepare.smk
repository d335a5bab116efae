rule prepare:
    input:
        config=PREPARE_CONFIG,  # the data section at the folder's training fraction
    output:
        train=DATA_FILES["train"],
        val=DATA_FILES["val"],
        test=DATA_FILES["test"],
        manifest=DATA_FILES["manifest"],
    params:
        code=code_digest("prepare"),  # the source its command runs (locvit.versioning)
        locvit=LOCVIT,
    log:
        str(LAYOUT.log_file("prepare", "{datadir}")),
    shell:
        "{params.locvit} prepare --data-config {input.config:q} --train {output.train:q} --val {output.val:q}"
        " --test {output.test:q} --manifest {output.manifest:q} > {log:q} 2>&1"

