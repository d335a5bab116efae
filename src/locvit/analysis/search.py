"""MaiT's ALS-guided mask search (MaiT Sec. 4.2), one round at a time.

Round 0 masks head 0 in every layer. Round 1 assigns masks per layer from round 0's ALS of head 0: at or
above ``all_above`` ("close to 1") every head is masked, below ``remove_below`` ("close to 0") none, in between
head 0 keeps its mask. Each later round calibrates: a masked head whose ALS fell below ``remove_below`` loses
its mask. The paper gives no numbers for "close to": the thresholds are ``mask_search`` keys. A round's spec
is its ``masked_heads`` (``sch1``, then head indices per layer). Pure Python: the Snakemake checkpoint that
derives a spec starts no torch.
"""

from __future__ import annotations

from locvit.errors import InputError

# Round 0: head 0 masked in every layer, i.e. MaiT's Sch.1 (the first head of each layer).
INITIAL = "sch1"


def _per_layer(spec, depth: int) -> list[list[int]]:
    return [[0] for _ in range(depth)] if spec == INITIAL else [list(h) for h in spec]


def assign(
    als: list[list[float]], spec: list[list[int]], num_heads: int, all_above: float, remove_below: float
) -> tuple[list[list[int]], list[str]]:
    """Round 1: per layer, from the ALS of head 0 (``als[layer][head]``)."""
    new, why = [], []
    for layer, (scores, heads) in enumerate(zip(als, spec)):
        score = scores[0]
        if 0 not in heads:  # head 0 was not masked here: nothing to read the layer's locality from
            new.append(list(heads))
            why.append(f"layer {layer}: head 0 unmasked, unchanged")
        elif score >= all_above:
            new.append(list(range(num_heads)))
            why.append(f"layer {layer}: ALS of head 0 {score:.3f} >= {all_above}: mask all {num_heads} heads")
        elif score < remove_below:
            new.append([])
            why.append(f"layer {layer}: ALS of head 0 {score:.3f} < {remove_below}: remove the mask")
        else:
            new.append([0])
            why.append(f"layer {layer}: ALS of head 0 {score:.3f} in between: keep head 0's mask")
    return new, why


def calibrate(als: list[list[float]], spec: list[list[int]], remove_below: float) -> tuple[list[list[int]], list[str]]:
    """Later rounds: drop the mask of every masked head whose ALS is below ``remove_below``."""
    new, why = [], []
    for layer, (scores, heads) in enumerate(zip(als, spec)):
        dropped = [h for h in heads if scores[h] < remove_below]
        new.append([h for h in heads if h not in dropped])
        why.append(
            f"layer {layer}: "
            + (", ".join(f"head {h} ALS {scores[h]:.3f} < {remove_below}: remove" for h in dropped) or "unchanged")
        )
    return new, why


def next_spec(
    round_: int,
    previous: dict | None = None,
    als: list[list[float]] | None = None,
    all_above: float = 0.8,
    remove_below: float = 0.3,
) -> dict:
    """The spec of ``round_`` (written as the round's spec.json) from the previous round's.

    ``als[layer][head]`` is the previous round's ALS; its shape gives depth and heads.
    """
    if round_ == 0:
        return {"round": 0, "masked_heads": INITIAL, "rule": ["initial: head 0 masked in every layer (Sch.1)"]}
    if previous is None or als is None:
        raise InputError(f"round {round_} needs the previous round's spec and ALS")
    spec = _per_layer(previous["masked_heads"], len(als))
    if len(spec) != len(als):
        raise InputError(f"the ALS has {len(als)} layers, the previous spec {len(spec)}: not this search's model")
    if round_ == 1:
        spec, why = assign(als, spec, len(als[0]), all_above, remove_below)
    else:
        spec, why = calibrate(als, spec, remove_below)
    return {"round": round_, "masked_heads": spec, "rule": why}


def search_run_config(base: dict, spec: dict) -> dict:
    """A search round's run config: the base variant's (a resolved run config) with the round's masks."""
    cfg = {**base, "variant": f"search_round{spec['round']}"}
    cfg["model_kwargs"] = {**base["model_kwargs"], "masked_heads": spec["masked_heads"]}
    return cfg


def search_table(specs: list[dict], analyses: list[dict], evals: list[dict]) -> list[dict]:
    """One row per round: its masks, the ALS of its masked heads and its accuracy."""
    rows = []
    for spec, analysis, result in zip(specs, analyses, evals):
        heads = _per_layer(spec["masked_heads"], len(analysis["als"]))
        masked = [analysis["als"][layer][h] for layer, hs in enumerate(heads) for h in hs]
        rows.append(
            {
                "round": spec["round"],
                "masked_heads_per_layer": [len(h) for h in heads],
                "masked_heads": sum(len(h) for h in heads),
                "mean_als_masked": sum(masked) / len(masked) if masked else None,
                "val_top1": 100.0 * result["val_top1"],
                "test_top1": 100.0 * result["test_top1"],
                "mlflow_run_id": result["mlflow_run_id"],
                "change": "; ".join(r for r in spec["rule"] if not r.endswith("unchanged")) or "no change",
            }
        )
    return rows
