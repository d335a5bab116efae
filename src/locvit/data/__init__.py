"""Datasets: sources behind one small interface, preparation into FFCV files, loaders."""
