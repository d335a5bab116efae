rule report:
    input:
        eval_files,
    output:
        md=f"{REPORT_DIR}/results.md",
        csv=f"{REPORT_DIR}/results.csv",
        tex=f"{REPORT_DIR}/results.tex",
        summary=f"{REPORT_DIR}/summary.json",
    params:
        locvit=LOCVIT,
        params_file=PARAMS_FILE,
    conda:
        ENV
    log:
        f"{LOG_DIR}/report.log",
    shell:
        "{params.locvit} report --params {params.params_file:q} --eval {input:q} --md {output.md:q} --csv {output.csv:q}"
        " --tex {output.tex:q} --summary {output.summary:q} > {log:q} 2>&1"
