"""The mask search's table (``locvit search-table``): its rounds rendered with the report's table model.

The rounds' rows come from ``locvit.analysis.search.search_table`` (pure Python); the table is
rendered here, in the report's layer, so that the search (which the training job runs) imports
nothing of the report.
"""

from __future__ import annotations

from locvit.report.render import Table, to_markdown


def table_markdown(rows: list[dict], config: dict) -> str:
    """The rounds (``locvit.analysis.search.search_table``) as a table: one row per round, one seed each.
    ``config``: the job's (``locvit.config.jobs.search_table_config``)."""
    search = config["mask_search"]
    table = Table(
        "mask_search",
        f"MaiT mask search: {config['study']}, variant {search['variant']}, seed {search['seed']}",
        f"Thresholds: all heads at ALS >= {search['all_above']}, remove below {search['remove_below']} "
        "(MaiT Sec. 4.2). Accuracies in %, one run per round.",
        [
            "Round",
            "Masked heads per layer",
            "Masked heads",
            "Mean ALS of masked heads",
            "Val top-1",
            "Test top-1",
            "MLflow run",
            "What changed",
        ],
        [
            [
                r["round"],
                str(r["masked_heads_per_layer"]),
                r["masked_heads"],
                r["mean_als_masked"],
                r["val_top1"],
                r["test_top1"],
                f"`{r['mlflow_run_id']}`",
                r["change"],
            ]
            for r in rows
        ],
        formats={3: ".3f"},
    )
    return to_markdown(table, level=1)
