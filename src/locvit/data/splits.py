"""The seeded stratified split of a dataset into train, val and test, and what it leaves in each.

The prepare step splits with ``split_indices``; ``locvit validate`` runs the same function on
the labels of a source whose labels are known without its images (``locvit.data.sources.
DatasetSource.known_labels``: digits, CIFAR), so a study whose training split would be smaller than
one batch, would leave a class without a training image, or asks to analyse more test images than
there are, is refused before anything runs. numpy only (scikit-learn's splitter is imported when called).
"""

from __future__ import annotations

import numpy as np

from locvit.errors import InputError


def split_indices(
    labels: np.ndarray,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    fixed_test: np.ndarray | None = None,
    train_fraction: float = 1.0,
) -> dict[str, np.ndarray]:
    """Stratified train/val/test indices (sorted), reproducible for a given seed.

    Without ``fixed_test`` the test split is ``test_fraction`` of everything and val is
    ``val_fraction`` of everything. With an official test split, it is the test split
    and val is ``val_fraction`` of the rest. ``train_fraction`` < 1 then keeps a
    stratified subset of the training split (``fraction_subset``); val and test do
    not depend on it.
    """
    from sklearn.model_selection import train_test_split  # 4 s to import: only the prepare step needs it

    def stratified(indices, share, key, value, seed):
        try:
            return train_test_split(indices, test_size=share, stratify=labels[indices], random_state=seed)
        except ValueError as err:  # too few images of a class, or a share smaller than one image per class
            raise InputError(
                f"{key}: {value} cannot hold out a share of every class from {len(indices)} images of "
                f"{len(np.unique(labels[indices]))} classes ({err}); give every class more images, or a "
                f"larger {key}"
            ) from err

    idx = np.arange(len(labels))
    if fixed_test is None:
        rest, test = stratified(idx, test_fraction, "data.test_fraction", test_fraction, seed)
        val_of_rest = val_fraction / (1.0 - test_fraction)
    else:
        test = np.asarray(fixed_test)
        rest = np.setdiff1d(idx, test)
        val_of_rest = val_fraction
    train, val = stratified(rest, val_of_rest, "data.val_fraction", val_fraction, seed + 1)
    if train_fraction < 1.0:
        train = fraction_subset(train, labels, train_fraction, seed + 2)
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def fraction_subset(train: np.ndarray, labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The first ``fraction`` of one seeded, class-interleaved order of ``train``.

    Each class's images are shuffled and the k-th of a class of n gets the key
    (k + 0.5) / n; sorting by key (random tie-break) interleaves the classes in
    proportion, so any prefix is stratified: with balanced classes every class keeps
    within one image of ``fraction`` of its images. The order does not depend on
    ``fraction``, so smaller fractions are nested in larger ones (5% is a subset of 25%):
    a data-fraction curve then differs only in how much data is added. The size is
    ``fraction`` of the split rounded down (as scikit-learn's ``train_size``), at least 1.
    """
    rng = np.random.default_rng(seed)
    y = labels[train]
    keys = np.empty(len(train))
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        keys[rng.permutation(members)] = (np.arange(len(members)) + 0.5) / len(members)
    order = np.lexsort((rng.random(len(train)), keys))  # by key, ties at random
    keep = max(1, int(np.floor(fraction * len(train) + 1e-9)))  # 1e-9: 0.3 x 10 is 2.99... in floating point
    return train[order[:keep]]


def empty_classes(labels: np.ndarray, train: np.ndarray, num_classes: int) -> list[int]:
    """The classes with no image in the training split ``train`` (indices into ``labels``)."""
    counts = np.bincount(labels[train], minlength=num_classes)
    return [int(c) for c in np.flatnonzero(counts == 0)]
