rule report:
    input:
        evals=eval_files,
        analyses=analysis_files,
        metrics=metrics_files,
        throughput=THROUGHPUT_FILE,
    output:
        md=f"{REPORT_DIR}/results.md",
        csv=report(f"{REPORT_DIR}/results.csv", caption="../report/results.rst", category="Results"),
        seeds=f"{REPORT_DIR}/results_seeds.csv",
        tex=f"{REPORT_DIR}/results.tex",
        summary=f"{REPORT_DIR}/summary.json",
        index=f"{REPORT_DIR}/index.md",
        record=f"{REPORT_DIR}/report.json",
        tables=report(directory(f"{REPORT_DIR}/tables"), patterns=["{name}.csv"], caption="../report/table.rst",
                      category="Tables"),
        figures=report(directory(f"{REPORT_DIR}/figures"), patterns=["{name}.png"],
                       caption="../report/figure.rst", category="Figures"),
        pdf=directory(f"{REPORT_DIR}/pdf"),
        metrics=directory(f"{REPORT_DIR}/metrics"),  # one JSON per variant: dvc metrics show
    params:
        locvit=LOCVIT,
        params_file=PARAMS_FILE,
        baseline=P["baseline"],  # params triggers: another baseline or margin re-runs the report
        margin=P["equivalence_margin"],
        ui_url=P["tracking"]["ui_url"],  # the tables' links to the MLflow UI
        study_dir=study_dir,
        out_dir=report_dir,
        tracking_db=TRACKING_DB,
    conda:
        ENV
    log:
        f"{LOG_DIR}/report.log",
    shell:
        "{params.locvit} report --params {params.params_file:q} --study-dir {params.study_dir:q}"
        " --out-dir {params.out_dir:q} --tracking-db {params.tracking_db:q} > {log:q} 2>&1"
