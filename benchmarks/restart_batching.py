"""Seconds per Adam step per restart of the optimisation attack (``fedvit.attacks.inversion.invert``) with 1, 2 and 4
restarts: the restarts run batched (one vmapped pass for all), so the time per restart-step should fall as
restarts are added. One captured update per setting (default tiny model, synthetic data, random init).

Usage: uv run --frozen python benchmarks/restart_batching.py [--steps 20] [--device cpu|cuda] [--model tiny|vit-s16]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch
from common import TINY, VIT_S16  # first: puts the checkout on sys.path

from fedvit.attacks.inversion import invert
from fedvit.audit.benchmark import DEFENCES, Setting, client_update_and_labels, defence_config, partitions
from fedvit.core.config import parse_config

MODELS = {"tiny": TINY, "vit-s16": VIT_S16}
SETTINGS = (Setting(4), Setting(2, steps=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="Adam steps per restart (default 20)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default="tiny", choices=tuple(MODELS))
    args = parser.parse_args()
    print(f"command: uv run --frozen python benchmarks/restart_batching.py --steps {args.steps} "
          f"--device {args.device} --model {args.model}   (torch threads: {torch.get_num_threads()})")  # fmt: skip
    print("\n| setting | restarts | s per restart-step | final 1 − cos |\n|---|---|---|---|")
    base = parse_config({"device": args.device, "audit.max-seconds": 1e9})
    base = dataclasses.replace(base, model=MODELS[args.model])
    with tempfile.TemporaryDirectory() as out:
        for setting in SETTINGS:
            config = defence_config(base, DEFENCES["plain"], 2, Path(out) / setting.label, setting)
            obs, _, _ = client_update_and_labels(config, 0, partitions(config, setting, 2), seed_key=1000)
            for restarts in (1, 2, 4):
                audit = dataclasses.replace(config.audit, iterations=args.steps, restarts=restarts)
                invert(obs, dataclasses.replace(audit, iterations=1, restarts=1))  # warm-up
                start = time.perf_counter()
                rec = invert(obs, audit)
                per_step = (time.perf_counter() - start) / (args.steps * restarts)
                match = rec.note.split("1−cos ")[1].split(";")[0]
                print(f"| {setting.label} | {restarts} | {per_step:.3f} | {match} |", flush=True)


if __name__ == "__main__":
    main()
