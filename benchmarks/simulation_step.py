"""Milliseconds per step of the audit's simulated local training (``fedvit.attacks.simulation.simulate``), with the
images laid out channels-last in memory (what the audit runs) and in PyTorch's default layout.

The label estimate, the membership shadows and the power twin all run ``simulate``: a realistic audit spends most of
its time there (the label estimate alone ran about 117 simulations per 3-epoch update). Each measurement is one
simulation of 1 epoch of 256 images in batches of 32 (8 steps) on one torch thread (as the label estimate's searches
run them, two side by side); the two layouts alternate, after one warm-up each, and the median of --repeats of each
is reported. Nothing else should run beside it.

    uv run --frozen python -m benchmarks.simulation_step --repeats 11
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Callable
from unittest import mock

import numpy as np
import torch

from benchmarks.common import ROOT, median_time
from fedvit.attacks import simulation
from fedvit.attacks.holdings import Auxiliary
from fedvit.audit.fedvit_run import fedvit_spec
from fedvit.core.config import parse_config
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe

IMAGES, BATCH = 256, 32
MODELS: dict[str, tuple[Callable[[], ModelSpec], str]] = {
    "test app's CNN (Flower's quickstart)": (
        lambda: ModelSpec("cnnapp.task:Net", app_dir=str(ROOT / "tests" / "thirdparty_app")), "fc3.bias"),
    "tiny ViT (fedvit's default, 32 px)": (lambda: fedvit_spec(parse_config({}), 10), "head.bias"),
    "ResNet-18 32 px": (lambda: ModelSpec("resnet18", num_classes=10), "fc.bias"),
}  # fmt: skip


def observation(spec: ModelSpec, head_bias: str) -> Observation:
    """A 1-epoch FedAvg reply's observation of ``spec`` (random init; simulate reads only the received weights)."""
    torch.manual_seed(0)
    model = spec.build(num_classes=10)
    state = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    client = ClientRecipe(IMAGES, BATCH, 1, 0.01, 0.9, 0.0, 0, False)
    return Observation(update=state, received=state, num_classes=10, spec=spec, skeleton=model, client=client,
                       head_bias=head_bias)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("command: uv run --frozen python -m benchmarks.simulation_step " + " ".join(sys.argv[1:]))
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    counts = np.full(10, IMAGES // 10) + (np.arange(10) < IMAGES % 10)
    steps = -(-IMAGES // BATCH)
    print(f"torch {torch.__version__}, 1 thread, {steps} steps of {BATCH} images per simulation, "
          f"median of {args.repeats}")  # fmt: skip
    for label, (make_spec, head_bias) in MODELS.items():
        obs = observation(make_spec(), head_bias)
        aux = Auxiliary(rng.random((500, *obs.spec.input_shape)), rng.integers(0, 10, 500), "uniform noise")
        run = functools.partial(simulation.simulate, obs, aux, counts, 0.9, seed=0)
        layouts = {"default": lambda x: x, "channels-last": simulation.channels_last}
        times = {layout: [] for layout in layouts}
        for repeat in range(args.repeats + 1):  # the layouts alternate (the machine's speed drifts); one warm-up
            for layout, arrange in layouts.items():
                with mock.patch.object(simulation, "channels_last", arrange):
                    seconds = median_time(1, run)
                if repeat:
                    times[layout].append(seconds / steps * 1000)
        times = {layout: statistics.median(found) for layout, found in times.items()}
        print(f"{label:38s} default {times['default']:7.1f} ms/step, channels-last {times['channels-last']:7.1f} "
              f"ms/step, ratio {times['channels-last'] / times['default']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
