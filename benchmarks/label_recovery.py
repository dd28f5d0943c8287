"""Label recovery accuracy of the audit's label attack (``fedvit.attacks.labels.recover_labels``) on
plain FedSGD updates of natural photographs, random and trained weights, per batch size (a multiset match,
duplicates included):

    uv run --frozen python -m benchmarks.label_recovery --data outputs/natural-32 --trained outputs/natural-trained
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT  # noqa: F401, E402  (puts the checkout first on sys.path)
from benchmarks.peer_breaching import plain_updates  # noqa: E402
from fedvit.attacks.labels import label_accuracy, recover_labels  # noqa: E402
from fedvit.audit.benchmark import Setting  # noqa: E402
from fedvit.core.config import parse_config  # noqa: E402
from fedvit.core.results import trained_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--trained", type=Path)
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    args = parser.parse_args()
    base = parse_config({"data.name": f"imagefolder:{args.data.resolve()}"})
    weights = {"random": base} | ({"trained": trained_model(base, args.trained)} if args.trained else {})
    print("| weights | B | label accuracy | updates using equal shares |")
    print("|---|---|---|---|")
    for name, config in weights.items():
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            made, _ = plain_updates(config, Setting(batch), args.updates, Path("/tmp/fedvit-labels"))
            found = [recover_labels(obs) for obs, _, _ in made]
            accuracy = np.mean([label_accuracy(c, labels) for (c, _), (_, _, labels) in zip(found, made, strict=True)])
            shares = sum(note == "p̄ as equal shares" for _, note in found)
            print(f"| {name} | {batch} | {accuracy:.1%} | {shares}/{len(found)} |", flush=True)


if __name__ == "__main__":
    main()
