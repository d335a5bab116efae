"""Results tables (and, later, plots) built from the evaluation files of a study."""
