"""Hard-link torch and its CUDA libraries from another venv of the same Python into this one.

The node's stand-in (.venv-node) and the floor lane (.venv-floor) hold the same torch with the same CUDA
wheels, about 4.7 GB each, and CI holds both on one disk (it once ran out there). Linking the files pip
installed (each distribution's RECORD) costs no space; pip then finds torch installed and satisfied.
Nothing is linked where the other venv is absent, is another Python, or holds another torch than the
pin: pip installs as usual.

    python link_torch.py SOURCE_VENV REQUIREMENTS   (run with the destination venv's python)
"""

import importlib.metadata as metadata
import os
import sys
import sysconfig
from pathlib import Path

LINKED = ("torch", "torchvision", "triton", "nvidia-", "cuda-")


def pins(requirements: Path) -> dict[str, str]:
    lines = (line.split("#")[0].strip() for line in requirements.read_text().splitlines())
    return dict(line.split("==", 1) for line in lines if "==" in line)


def main(source_venv: str, requirements: str) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    source = Path(source_venv) / site.relative_to(sys.prefix)
    if not source.is_dir():
        print(f"link_torch: {source} absent, pip installs torch")
        return
    dists = {d.metadata["Name"].lower(): d for d in metadata.distributions(path=[str(source)])}
    wanted = pins(Path(requirements)).get("torch")
    if "torch" not in dists or dists["torch"].version != wanted:
        print(f"link_torch: {source_venv} has no torch=={wanted}, pip installs torch")
        return
    count = 0
    for name, dist in dists.items():
        if not name.startswith(LINKED):
            continue
        for file in dist.files or ():
            src, dst = source / file, site / file
            if ".." in file.parts or dst.exists() or not src.is_file():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dst)
            count += 1
    print(f"link_torch: {count} files of torch {wanted} and its CUDA wheels linked from {source_venv}")


if __name__ == "__main__":
    main(*sys.argv[1:])
