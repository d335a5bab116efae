rule report:
    input:
        evals=eval_files,
        analyses=analysis_files,
        metrics=metrics_files,
        throughput=THROUGHPUT_FILE,
        config=REPORT_CONFIG,  # what it reads of params: the baseline, the margin, the variants and seeds, ...
        search=search_files(),  # the mask search's table, if any: the report is the study's last job, and it
        # closes the MLflow run tree (a search round trained after it left its variant's run RUNNING)
    output:
        md=str(REPORT["md"]),
        csv=report(str(REPORT["csv"]), caption="../report/results.rst", category="Results"),
        seeds=str(REPORT["seeds"]),
        tex=str(REPORT["tex"]),
        summary=str(REPORT["summary"]),
        evaluations=str(REPORT["evaluations"]),  # what results.csv is computed from (locvit stats)
        index=str(REPORT["index"]),
        record=str(REPORT["record"]),
        tables=report(directory(str(REPORT["tables"])), patterns=["{name}.csv"], caption="../report/table.rst",
                      category="Tables"),
        figures=report(directory(str(REPORT["figures"])), patterns=["{name}.png"],
                       caption="../report/figure.rst", category="Figures"),
        pdf=directory(str(REPORT["pdf"])),
        metrics=directory(str(REPORT["metrics"])),  # one JSON per variant: dvc metrics show
    params:
        code=code_digest("report"),  # the source its command runs (locvit.versioning)
        locvit=LOCVIT,
        study_dir=study_dir,
        out_dir=report_dir,
        tracking_db=TRACKING_DB,
    log:
        str(LAYOUT.log_file("report")),
    shell:
        "{params.locvit} report --report-config {input.config:q} --params \"$LOCVIT_STUDY_PARAMS\" --study-dir {params.study_dir:q}"
        " --out-dir {params.out_dir:q} --tracking-db {params.tracking_db:q} > {log:q} 2>&1"
