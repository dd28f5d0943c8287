"""Choose the optimisation attack's defaults by measurement: variants of ``audit.*`` on the same plain FedSGD
updates (random and trained weights), scored by the audit's own code (matched PSNR, SSIM, re-identification).

    uv run --frozen python -m benchmarks.attack_tuning --data outputs/natural-32 --trained outputs/natural-trained \\
        --variant "" --variant "tv=0.4" --variant "tv=0.4,keep=objective" --steps 600 --updates 2

A variant is comma-separated ``audit.*`` keys without the prefix (``tv=0.4,pos-weight=0``); "" is the defaults.
Every variant starts from random images (``closed-form-start=false``) with one restart unless it says otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT
from benchmarks.peer_breaching import plain_updates, scored_row
from fedvit.attacks.inversion import invert  # noqa: E402
from fedvit.audit.benchmark import Setting  # noqa: E402
from fedvit.core.config import AuditConfig, parse_config  # noqa: E402
from fedvit.core.results import trained_model  # noqa: E402


def _value(text: str) -> object:
    """A variant's value: JSON where it parses (numbers, true/false), else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip()


def variant_budget(base: AuditConfig, text: str, steps: int) -> AuditConfig:
    """``base`` with the variant's audit.* values, ``steps`` Adam steps, random starts, one restart, no time cap."""
    values = {
        f"audit.{k.strip()}": _value(v) for k, v in (item.split("=", 1) for item in text.split(",") if item.strip())
    }
    fixed = {"audit.iterations": steps, "audit.restarts": 1, "audit.closed-form-start": False}
    audit = parse_config(fixed | values).audit
    return dataclasses.replace(audit, max_seconds=math.inf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--trained", type=Path)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--batch-sizes", default="4")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "attack-tuning.json")
    args = parser.parse_args()
    base = parse_config({"data.name": f"imagefolder:{args.data.resolve()}"})
    weights = {"random": base} | ({"trained": trained_model(base, args.trained)} if args.trained else {})
    results = []
    for name, config in weights.items():
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            made, gallery = plain_updates(config, Setting(batch), args.updates, Path("/tmp/fedvit-tuning"))
            for text in args.variant:
                budget = variant_budget(config.audit, text, args.steps)
                print(f"{name} weights, B={batch}, variant {text or 'defaults'!r}:", flush=True)
                rows = []
                for k, (obs, truths, _) in enumerate(made):
                    start = time.perf_counter()
                    rec = invert(obs, budget)
                    rows.append(scored_row(text or "defaults", k, rec, truths, gallery, time.perf_counter() - start))
                results.append(
                    {"weights": name, "batch": batch, "variant": text or "defaults", "steps": args.steps,
                     **{m: float(np.mean([r[m] for r in rows])) for m in ("psnr", "ssim", "reid-top1", "reid-rank",
                                                                         "seconds")},
                     "updates": rows}
                )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "uv run --frozen python -m benchmarks.attack_tuning " + " ".join(repr(a) if " " in a or not a else a
                                                                              for a in sys.argv[1:])  # fmt: skip
    args.out.write_text(json.dumps({"command": command, "cells": results}, indent=1))
    print("| weights | B | variant | matched PSNR (dB) | SSIM | re-identified | mean rank | s/update |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['weights']} | {r['batch']} | {r['variant']} | {r['psnr']:.1f} | {r['ssim']:.3f} | "
              f"{r['reid-top1']:.0%} | {r['reid-rank']:.1f} | {r['seconds']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
