"""The attack audit: run every applicable attack on captured (or freshly produced) single-image updates, score
the reconstructions against the ground truth, and write a table and image grids.

``fedvit audit <capture dir> --out <dir>`` audits a run captured with ``capture.enabled``; ``fedvit audit
--benchmark`` needs no prior run: it produces one single-image update per image and defence through the real
client code (``clients.runner.train``) and audits them all (the layout of the papers' Fig. 4).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tqdm import tqdm

from attacks import april
from attacks.eavesdropper import CAPTURES, GROUND_TRUTH, unflatten
from attacks.labels import label_accuracy, recover_labels
from attacks.metrics import SETTINGS, best_flat_image, minimum_norm_limit, psnr, ssim
from attacks.observation import Observation, Reconstruction, dense_update, model_skeleton
from core.config import Config, parse_config
from core.params import HEAD_BIAS
from core.results import atomic_write

Attack = Callable[[Observation], Reconstruction]


def defence_of(config: Config) -> str:
    """A short public label of the defence a run used (from its run config)."""
    parts = []
    if config.strategy == "masked-fedsgd":
        m = config.mask
        parts.append("fixed-position" if m.mode == "fixed-position" else f"mask-{m.mode}-r{m.r:g}")
    if config.encryption.enabled:
        parts.append(f"encryption-{config.encryption.mode}")
    return "+".join(parts) or "none"


def attacks_for(obs: Observation) -> dict[str, Attack]:
    """The attacks worth running on this observation: the naive ones always, the defence-aware ones per defence."""
    config = obs.config
    chosen: dict[str, Attack] = {
        "APRIL-E (naive)": april.embedding_route,
        "APRIL attention (naive)": april.attention_route,
    }
    if obs.masks is not None:
        if config.mask.mode == "fixed-position":
            chosen["fixed-position-aware"] = april.fixed_position
        else:
            chosen["APRIL-E mask-aware"] = april.masked_embedding_route
    if config.encryption.enabled:
        chosen["known-plaintext"] = april.known_plaintext_route
        if obs.known_images:
            chosen["known images (collusion)"] = april.known_images_route
    return chosen


def score(rec: Reconstruction, truth: np.ndarray | None) -> tuple[float | None, float | None]:
    if rec.image is None or truth is None:
        return None, None
    return psnr(rec.image, truth), ssim(rec.image, truth)


Attacked = tuple[Observation, np.ndarray | None, dict[str, Reconstruction]]  # an update, its truth, its reconstructions


LABEL_ATTACK = "labels (head-bias gradient)"
BASELINE = "best flat image (reference: no information)"  # "reference" rows are not attacks


def label_row(obs: Observation, true_labels: np.ndarray | None) -> dict[str, Any]:
    """The label-recovery attack on one update, scored against the true labels when they are known."""
    start = time.perf_counter()
    counts, reason = recover_labels(obs)
    found = "" if counts is None else ", ".join(f"{c}×{n}" for c, n in enumerate(counts) if n)
    return {
        **obs.meta,
        "defence": defence_of(obs.config),
        "attack": LABEL_ATTACK,
        "psnr": None,
        "ssim": None,
        "seconds": time.perf_counter() - start,
        "note": reason or f"class×count: {found}",
        "label-accuracy": None if counts is None or true_labels is None else label_accuracy(counts, true_labels),
    }


def audit_observations(
    items: list[tuple[Observation, np.ndarray | None]],
    out: Path,
    title: str,
    grid_name: str = "grid.png",
    true_labels: list[np.ndarray | None] | None = None,
) -> tuple[list[dict[str, Any]], list[Attacked]]:
    """Attack every observation, score it, write ``audit.md``, ``audit.json`` and the image grid.

    ``true_labels`` (per item, when known) score the label-recovery attack. Returns the table rows and, per
    observation, its reconstructions by attack name.
    """
    out.mkdir(parents=True, exist_ok=True)
    rows, images = [], []
    labels = true_labels or [None] * len(items)
    for (obs, truth), labels_of_batch in zip(tqdm(items, desc="audit", unit="update"), labels, strict=True):
        rows.append(label_row(obs, labels_of_batch))
        recs = {}
        for name, attack in attacks_for(obs).items():
            start = time.perf_counter()
            rec = attack(obs)
            seconds = time.perf_counter() - start
            p, s = score(rec, truth)
            rows.append(
                {
                    **obs.meta,
                    "defence": defence_of(obs.config),
                    "attack": name,
                    "psnr": p,
                    "ssim": s,
                    "seconds": seconds,
                    "note": rec.note,
                }
            )
            recs[name] = rec
        if truth is not None:
            flat = best_flat_image(truth)
            rows.append(
                {
                    **obs.meta,
                    "defence": defence_of(obs.config),
                    "attack": BASELINE,
                    "psnr": psnr(flat, truth),
                    "ssim": ssim(flat, truth),
                    "seconds": 0.0,
                    "note": "the image's per-channel mean: what an attack that learned nothing can reach",
                }
            )
        if truth is not None and obs.config.model.first_block == "no-ln":
            limit = minimum_norm_limit(truth, obs)
            rows.append(
                {
                    **obs.meta,
                    "defence": defence_of(obs.config),
                    "attack": "minimum-norm limit (reference)",
                    "psnr": psnr(limit, truth),
                    "ssim": ssim(limit, truth),
                    "seconds": 0.0,
                    "note": "true patches projected onto W_E's row space; not an attack",
                }
            )
        images.append((obs, truth, recs))
    report = {"title": title, "metrics": SETTINGS, "rows": rows, "summary": summarize(rows)}
    atomic_write(out / "audit.json", json.dumps(report, indent=1, default=float).encode())
    atomic_write(out / "audit.md", markdown(report).encode())
    save_grid(images, out / grid_name)
    return rows, images


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean PSNR/SSIM and time per (defence, attack), over the updates that could be attacked."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["defence"], row["attack"]), []).append(row)
    out = []
    for (defence, attack), members in groups.items():
        scored = [m for m in members if m["psnr"] is not None]
        out.append(
            {
                "defence": defence,
                "attack": attack,
                "updates": len(members),
                "scored": len(scored),
                "psnr": float(np.mean([m["psnr"] for m in scored])) if scored else None,
                "ssim": float(np.mean([m["ssim"] for m in scored])) if scored else None,
                "seconds": float(np.mean([m["seconds"] for m in members])),
                "note": members[0]["note"],
                "label-accuracy": _mean_of(members, "label-accuracy"),
            }
        )
    return out


def _mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else None


def markdown(report: dict[str, Any]) -> str:
    def fmt(v, spec):
        return "—" if v is None else format(v, spec)

    lines = [
        f"# {report['title']}",
        "",
        "## Summary (mean over updates)",
        "",
        "| defence | attack | updates | PSNR (dB) | SSIM | label accuracy | seconds | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["summary"]:
        lines.append(
            f"| {r['defence']} | {r['attack']} | {r['updates']} | {fmt(r['psnr'], '.1f')} | "
            f"{fmt(r['ssim'], '.3f')} | {fmt(r.get('label-accuracy'), '.0%')} | {r['seconds']:.3f} | {r['note']} |"
        )
    lines += [
        "",
        "## Every update",
        "",
        "| node | round | image | defence | attack | PSNR (dB) | SSIM | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r.get('partition', '')} | {r.get('round', '')} | {r.get('image', '')} | {r['defence']} | "
            f"{r['attack']} | {fmt(r['psnr'], '.1f')} | {fmt(r['ssim'], '.3f')} | {r['seconds']:.3f} |"
        )
    lines += ["", "Metrics: " + "; ".join(f"{k}: {v}" for k, v in report["metrics"].items()), ""]
    return "\n".join(lines)


def save_grid(images: list[tuple[Observation, np.ndarray | None, dict[str, Reconstruction]]], path: Path) -> None:
    """One row per update: original | each attack's reconstruction (blank where an attack could not run)."""
    from core.plots import plt

    if not images:
        return
    names = list(dict.fromkeys(n for _, _, recs in images for n in recs))
    cols = 1 + len(names)
    fig, axes = plt.subplots(len(images), cols, figsize=(1.6 * cols, 1.6 * len(images)), squeeze=False)
    for i, (obs, truth, recs) in enumerate(images):
        panels = [("original", truth)] + [(n, recs[n].image if n in recs else None) for n in names]
        for j, (name, img) in enumerate(panels):
            ax = axes[i, j]
            ax.axis("off")
            if img is not None:
                ax.imshow(np.transpose(img, (1, 2, 0)))
            if i == 0:
                ax.set_title(name, fontsize=6)
        axes[i, 0].text(
            -0.1, 0.5, obs.meta.get("label", ""), transform=axes[i, 0].transAxes, fontsize=6, ha="right", va="center"
        )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# ---------------------------------------------------------------------------- captured runs


def observation_from_capture(stem: Path, handshake: tuple[dict, dict] | None) -> Observation:
    """Rebuild what the wire observer saw for one train message (``<stem>.json`` + its two safetensors)."""
    manifest = json.loads(stem.with_name(f"{stem.name}.json").read_text())
    config = parse_config(manifest["run_config"])
    sent = unflatten(load_file(stem.with_name(f"{stem.name}.sent.safetensors")))
    received = unflatten(load_file(stem.with_name(f"{stem.name}.received.safetensors")))["arrays"]
    num_classes = int(received[HEAD_BIAS].shape[0])
    expected = {n: tuple(p.shape) for n, p in model_skeleton(config, num_classes).named_parameters()}
    got = {n: tuple(a.shape) for n, a in received.items()}
    if got != expected:
        bad = sorted(set(got.items()) ^ set(expected.items()))[:3]
        raise ValueError(f"{stem}: the capture does not match the model of its run config (e.g. {bad})")
    update, masks = dense_update(sent, expected)
    plain, cipher = handshake if handshake is not None else (None, None)
    meta = {
        "partition": manifest.get("partition"),
        "round": manifest.get("round"),
        "label": f"p{manifest.get('partition')} r{manifest.get('round')}",
        "num-examples": manifest.get("sent", {}).get("metrics", {}).get("metrics", {}).get("num-examples"),
    }
    return Observation(
        update=update,
        received=received,
        config=config,
        num_classes=num_classes,
        masks=masks,
        known_plaintext=plain,
        known_ciphertext=cipher,
        meta=meta,
    )


def audit_captures(capture_dir: Path, out: Path) -> list[dict[str, Any]]:
    """Audit every captured train update under ``capture_dir`` (a run's ``captures/`` or the run folder)."""
    capture_dir = capture_dir / CAPTURES if (capture_dir / CAPTURES).is_dir() else capture_dir
    if not capture_dir.is_dir():
        raise FileNotFoundError(f"no captures in {capture_dir}")
    run = capture_dir.parent
    stems = sorted(p.with_suffix("") for p in capture_dir.glob("round-*/partition-*.json") if "handshake" not in p.name)
    if not stems:
        raise FileNotFoundError(f"no captured train messages in {capture_dir} (was capture.enabled on?)")
    handshakes = sorted(capture_dir.glob("round-0000/partition-*-handshake.json"))
    handshake = None
    if handshakes:  # the wire saw the public initial layers go down and their encryption come back
        stem = handshakes[0].with_suffix("")
        plain = unflatten(load_file(stem.with_name(f"{stem.name}.received.safetensors")))["arrays"]
        cipher = unflatten(load_file(stem.with_name(f"{stem.name}.sent.safetensors")))["arrays"]
        handshake = (plain, cipher)
    items, labels = [], []
    for stem in stems:
        obs = observation_from_capture(stem, handshake)
        if obs.config.encryption.mode == "private-init":
            obs = dataclasses.replace(obs, known_plaintext=None, known_ciphertext=None)  # the pair is not a pair
        truth_path = run / GROUND_TRUTH / stem.parent.name / f"{stem.name}.safetensors"
        recorded = load_file(truth_path) if truth_path.exists() else None
        truth = recorded["images"][0] if recorded is not None else None
        if (obs.meta.get("num-examples") or 1) > 1:
            obs.meta["note"] = "batch size > 1: the closed forms recover a mixture (scored against image 0)"
        items.append((obs, truth))
        labels.append(recorded["labels"] if recorded is not None else None)
    print(f"audit: {len(items)} captured update(s) from {capture_dir}", flush=True)
    return audit_observations(items, out, f"fedvit audit of {run}", true_labels=labels)[0]
