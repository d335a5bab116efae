"""The data-efficiency study under either protocol: ``presets/data_efficiency.yaml`` with its
``fraction_protocol`` and the ``seed_budget`` that protocol was run with.

``make efficiency`` runs the preset as written (the anchors' protocol, ``same_images``); ``make efficiency
PROTOCOL=same_epochs`` runs this script first, which writes the preset with ``fraction_protocol: same_epochs``
and the equal-epochs budget (one full run's images per fraction, at most 10 seeds: more seeds at the
smaller fractions) to the file it is given. The two runs share the study's folder: the full-data runs are
the same runs under both protocols, so the second run trains only the fractions below 1.

    python -m doctools.efficiency_preset same_epochs results/data_efficiency_same_epochs.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from locvit.config import FRACTION_PROTOCOLS, validate_params
from locvit.io import write_text

PRESET = Path(__file__).resolve().parent.parent / "presets" / "data_efficiency.yaml"
#: Each protocol's seed budget: same_images as the preset holds it; same_epochs as docs/data_efficiency.md's
#: equal-epochs table was run (a seed at f costs f of a full run, so round(1 / f) seeds, at most 10).
BUDGETS = {"same_epochs": {"full_runs": 1, "max_seeds": 10}}


def preset(protocol: str) -> dict:
    """The preset's study under ``protocol``, validated."""
    params = yaml.safe_load(PRESET.read_text())
    params["fraction_protocol"] = protocol
    params["seed_budget"] = BUDGETS.get(protocol, params["seed_budget"])
    validate_params(params, check_models=False)
    return params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("protocol", choices=FRACTION_PROTOCOLS)
    parser.add_argument("out", type=Path, help="the params file to write")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {PRESET.name} with fraction_protocol: {args.protocol} (written by doctools/{Path(__file__).name})\n"
    write_text(args.out, header + yaml.safe_dump(preset(args.protocol), sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
