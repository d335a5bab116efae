"""The report step: tables and figures of a finished study.

Entry point: ``locvit.report.build.build_report``. Modules: ``study`` (reads the
result files), ``render`` (one table model as Markdown, CSV, LaTeX), ``tables`` (the
results table), ``papers`` (tables shaped like the MaiT, LSA and IBiT papers'),
``plots`` (figures with captions), ``stats`` (intervals, Welch's test, Holm's correction).
"""
