"""Images from FedAvg updates of small local datasets: fedvit's unrolled gradient matching, its FedAvg-aware
variant (per-epoch image sets tied by an order-invariant prior, Dimitrov et al., "Data Leakage in Federated
Averaging", TMLR 2022, arXiv 2206.12395) and breaching's multi-step user (``local_updates``: Inverting Gradients
unrolled over the steps) on the same updates.

Each update: the test app's CNN at initialisation, N natural-photo crops (scikit-image's bundled photographs,
32 px, one class per photograph), E local epochs of batch B, the client reshuffling every epoch, plain SGD (breaching
models no momentum). fedvit's attacks recover the labels themselves; breaching is handed the true labels of every
step (it needs them). Scored by the audit's code: matched PSNR/SSIM, images recovered (matched PSNR ≥ 19 dB, the
threshold of Dimitrov et al.'s scripts), re-identification against the same protocol's null.

    uv run --frozen --group peer python -m benchmarks.fedavg_inversion   # writes docs/results/data/fedavg-inversion.csv
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from benchmarks.common import ROOT, write_csv
from benchmarks.natural_images import write_natural_images

sys.path.insert(0, str(ROOT / "tests" / "thirdparty_app"))

from benchmarks.peer_breaching import breaching_reconstruct  # noqa: E402
from fedvit.attacks.inversion import fedavg_aware_invert, invert  # noqa: E402
from fedvit.attacks.reidentification import Gallery  # noqa: E402
from fedvit.audit.metrics import best_flat_image, psnr, score  # noqa: E402
from fedvit.core.config import AuditConfig  # noqa: E402
from fedvit.core.model import classify  # noqa: E402
from fedvit.observed.model_spec import ModelSpec  # noqa: E402
from fedvit.observed.observation import Observation, Reconstruction, attack_model  # noqa: E402
from fedvit.observed.recipe import ClientRecipe

OUT = ROOT / "docs" / "results" / "data" / "fedavg-inversion.csv"
SPEC = ModelSpec("cnnapp.task:Net", app_dir=str(ROOT / "tests" / "thirdparty_app"))
CASES = ((8, 4, 3), (16, 4, 3))  # (images, batch, epochs)
UPDATES, STEPS, LR = 2, 1000, 0.05
RECOVERED_DB = 19.0
TOOLS = ("fedvit unrolled (recovered labels)", "fedvit FedAvg-aware (recovered labels)",
         "breaching local_updates (true labels per step)")  # fmt: skip


def photos(count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` crops per photograph ([n, 3, 32, 32] in [0, 1]) and their photograph's index as the label."""
    with tempfile.TemporaryDirectory() as tmp:
        root = write_natural_images(Path(tmp), per_class=count)
        classes = sorted(p.name for p in root.iterdir())
        images, labels = [], []
        for k, name in enumerate(classes):
            for f in sorted((root / name).iterdir()):
                images.append(np.asarray(Image.open(f).convert("RGB"), np.float64).transpose(2, 0, 1) / 255)
                labels.append(k)
    return np.stack(images), np.asarray(labels)


def client_update(images: np.ndarray, labels: np.ndarray, batch: int, epochs: int, seed: int):
    """The client: E epochs, reshuffled each epoch, plain SGD; the observation and breaching's per-step labels."""
    torch.manual_seed(seed)
    model = SPEC.build(10)
    received = {n: p.detach().numpy().copy() for n, p in model.state_dict().items()}
    x, y = torch.as_tensor(images, dtype=torch.float32), torch.as_tensor(labels)
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.SGD(model.parameters(), lr=LR)
    step_labels = []
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for first in range(0, len(y), batch):
            chunk = order[first : first + batch]
            step_labels.append(y[chunk].sort()[0])
            optimiser.zero_grad()
            F.cross_entropy(classify(model, x[chunk]), y[chunk]).backward()
            optimiser.step()
    sent = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    client = ClientRecipe(len(y), batch, epochs, LR, 0.0, 0.0, 0, False)
    obs = Observation(update=sent, received=received, num_classes=10, spec=SPEC,
                      skeleton=SPEC.build(10), client=client, head_bias="fc3.bias", start_seed=seed + 1)  # fmt: skip
    return obs, step_labels


def breaching_fedavg(obs: Observation, step_labels: list[torch.Tensor], labels: np.ndarray, seed: int):
    model = attack_model(obs)
    for p in model.parameters():
        p.requires_grad_(True)
    client = obs.client
    moved = {n: obs.update[n] - obs.received[n] for n in obs.update}
    local = {"lr": LR, "steps": client.steps, "data_per_step": client.batch, "labels": step_labels,
             "all_labels": torch.as_tensor(np.sort(labels))}  # fmt: skip
    rec = breaching_reconstruct(model, (3, 32, 32), (0.5,) * 3, (0.5,) * 3, 10, moved, client.examples, STEPS,
                                seed, local)  # fmt: skip
    return rec


def row(case: tuple[int, int, int], k: int, tool: str, rec: Reconstruction, truths, gallery, seconds) -> dict:
    scored = score(rec, truths, gallery)
    per = scored.per_image_psnr
    n, batch, epochs = case
    out = {"images": n, "batch": batch, "epochs": epochs, "update": k, "attack": tool,
           "matched PSNR (dB)": round(scored.psnr, 2), "SSIM": round(scored.ssim, 3),
           "recovered (≥ 19 dB)": f"{sum(p >= RECOVERED_DB for p in per)}/{len(per)}",
           "re-identified": round(scored.reid_top1, 3), "null": scored.reid_null,
           "flat reference (dB)": round(float(np.mean([psnr(best_flat_image(t), t) for t in truths])), 2),
           "seconds": round(seconds, 1)}  # fmt: skip
    print(out, flush=True)
    return out


def main() -> None:
    torch.set_num_threads(2)
    images, labels = photos(30)
    rng = np.random.default_rng(0)
    budget = AuditConfig(iterations=STEPS, restarts=1, max_seconds=math.inf)
    rows = []
    for case in CASES:
        n, batch, epochs = case
        for k in range(UPDATES):
            pick = rng.choice(len(images), n, replace=False)
            rest = np.setdiff1d(np.arange(len(images)), pick)
            gallery = Gallery(images[rng.choice(rest, 99 + 2 * n, replace=False)], "other crops")
            obs, step_labels = client_update(images[pick], labels[pick], batch, epochs, seed=k)
            for tool in TOOLS:
                started = time.perf_counter()
                if tool == TOOLS[0]:
                    rec = invert(obs, budget)
                elif tool == TOOLS[1]:
                    rec = fedavg_aware_invert(obs, budget)
                else:
                    rec = breaching_fedavg(obs, step_labels, labels[pick], k)
                rows.append(row(case, k, tool, rec, images[pick], gallery, time.perf_counter() - started))
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
