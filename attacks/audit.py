"""The attack audit: run every applicable attack on captured (or freshly produced) single-image updates, score
the reconstructions against the ground truth, and write a table and image grids.

``fedvit audit <capture dir> --out <dir>`` audits a run captured with ``capture.enabled``; ``fedvit audit
--benchmark`` needs no prior run: it produces one single-image update per image and defence through the real
client code (``clients.runner.train``) and audits them all (the layout of the papers' Fig. 4).
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tqdm import tqdm

from attacks import april, reidentification
from attacks.cocktail import cocktail_party
from attacks.eavesdropper import CAPTURES, GROUND_TRUTH, unflatten
from attacks.frontier import mean_or_none, reid_cell, write_frontier
from attacks.inversion import collusion_inversion, invert
from attacks.labels import label_accuracy, recover_labels
from attacks.metrics import SETTINGS, best_flat_image, match_batch, minimum_norm_limit, psnr, ssim
from attacks.observation import Observation, Reconstruction, as_gradient, dense_update, model_skeleton, recipe
from attacks.reidentification import Gallery
from core.config import AuditConfig, Config, parse_config
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
    if config.dp.enabled:
        parts.append(f"dp-{config.dp.mode}-σ{config.dp.noise_multiplier:g}-C{config.dp.clipping_norm:g}")
    if config.adversarial.enabled:
        parts.append("pgd-at")
    return "+".join(parts) or "none"


def naive_embedding_route(obs: Observation) -> Reconstruction:
    """APRIL-E on the update read as a gradient (a FedAvg update's weight change is lr times a summed gradient)."""
    return april.embedding_route(as_gradient(obs))


def naive_attention_route(obs: Observation) -> Reconstruction:
    """APRIL's attention closed form on the update read as a gradient."""
    return april.attention_route(as_gradient(obs))


def attacks_for(obs: Observation) -> dict[str, Attack]:
    """The attacks worth running on this observation: the closed forms and the optimisation attack always (the
    closed forms read a FedAvg update's weight change as a summed gradient), the batch ICA attack on FedSGD
    batches, and the defence-aware closed forms per defence."""
    config = obs.config
    chosen: dict[str, Attack] = {
        "APRIL-E (naive)": naive_embedding_route,
        "APRIL attention (naive)": naive_attention_route,
    }
    batch = recipe(obs)
    if batch.sends_gradient and batch.batch > 1:
        chosen[BATCH_ICA] = cocktail_party
    if obs.masks is not None:
        if config.mask.mode == "fixed-position":
            chosen["fixed-position-aware"] = april.fixed_position
        else:
            chosen["APRIL-E mask-aware"] = april.masked_embedding_route
    if config.encryption.enabled:
        chosen["known-plaintext"] = april.known_plaintext_route
        if obs.known_images:
            chosen["known images (collusion)"] = april.known_images_route
            chosen[COLLUSION_OPTIMISATION] = collusion_inversion
    chosen[OPTIMISATION] = invert
    return chosen


OPTIMISATION = "gradient matching (optimisation, defence-aware)"
COLLUSION_OPTIMISATION = "collusion key, then gradient matching"
BATCH_ICA = "patch-embedding ICA (batch)"
LABEL_ATTACK = "labels (head-bias gradient)"
BASELINE = "best flat image (reference: no information)"  # "reference" rows are not attacks
DATASET_MEAN = "dataset mean image (reference: no information)"


def as_batch(truth: np.ndarray | None) -> list[np.ndarray] | None:
    """Ground truth as a list of [C, H, W] images (a single image or a batch [n, C, H, W])."""
    if truth is None:
        return None
    truth = np.asarray(truth)
    return [truth] if truth.ndim == 3 else list(truth)


REID_FIELDS = ("reid-top1", "reid-rank", "reid-ranks", "reid-gallery", "reid-chance")


def score(rec: Reconstruction, truth: np.ndarray | None, gallery: Gallery | None = None) -> dict[str, Any]:
    """Matched scores of a reconstruction against the true batch.

    Reconstructions and true images are matched one to one (Hungarian assignment on PSNR); a true image left
    without a reconstruction is scored as the best flat image (what a guess without information reaches), so
    the mean over the batch never rewards an attack for returning fewer images. With a ``gallery``, each
    matched reconstruction is also re-identified among the true image and the decoys
    (:mod:`attacks.reidentification`).
    """
    truths = as_batch(truth)
    if rec.image is None or truths is None:
        return {"psnr": None, "ssim": None, "per-image-psnr": None, "matched": None} | dict.fromkeys(REID_FIELDS)
    images = rec.all_images
    pairs = match_batch(images, truths)
    flats = [best_flat_image(t) for t in truths]
    per_psnr = [psnr(f, t) for f, t in zip(flats, truths, strict=True)]
    per_ssim = [ssim(f, t) for f, t in zip(flats, truths, strict=True)]
    for i, j, value in pairs:
        per_psnr[j], per_ssim[j] = value, ssim(images[i], truths[j])
    reid = reid_scores({j: images[i] for i, j, _ in pairs}, truths, gallery, flats)
    return {
        "psnr": float(np.mean(per_psnr)),
        "ssim": float(np.mean(per_ssim)),
        "per-image-psnr": per_psnr,
        "matched": f"{len(pairs)}/{len(truths)}",
    } | reid


def reid_scores(
    matched: dict[int, np.ndarray], truths: list[np.ndarray], gallery: Gallery | None, flats: list[np.ndarray]
) -> dict[str, Any]:
    """:func:`attacks.reidentification.score_batch`, or every re-identification field None without a gallery."""
    if gallery is None:
        return dict.fromkeys(REID_FIELDS)
    return reidentification.score_batch(matched, truths, gallery, flats)


Attacked = tuple[Observation, np.ndarray | None, dict[str, Reconstruction]]  # an update, its truth, its reconstructions


def label_row(obs: Observation, true_labels: np.ndarray | None) -> dict[str, Any]:
    """The label-recovery attack on one update, scored against the true labels when they are known."""
    start = time.perf_counter()
    counts, reason = recover_labels(obs)
    found = "" if counts is None else ", ".join(f"{c}×{n}" for c, n in enumerate(counts) if n)
    return {
        **obs.meta,
        "defence": defence_of(obs.config),
        "attack": LABEL_ATTACK,
        "budget": None,
        "psnr": None,
        "ssim": None,
        "seconds": time.perf_counter() - start,
        "note": reason if counts is None else f"class×count: {found}" + (f" ({reason})" if reason else ""),
        "label-accuracy": None if counts is None or true_labels is None else label_accuracy(counts, true_labels),
    }


def reference_rows(
    obs: Observation, truth: np.ndarray, dataset_mean: np.ndarray | None, gallery: Gallery | None = None
) -> list[dict[str, Any]]:
    """No-information baselines beside every scored update (and APRIL's minimum-norm limit on no-LN models)."""
    truths = as_batch(truth)
    flats = [best_flat_image(t) for t in truths]
    references = [(BASELINE, flats, "per-channel mean of each true image")]
    if dataset_mean is not None:
        references.append((DATASET_MEAN, [dataset_mean] * len(truths), "the mean of the dataset's images"))
    if obs.config.model.first_block == "no-ln":
        references.append(
            ("minimum-norm limit (reference)", [minimum_norm_limit(t, obs) for t in truths], "true patches projected "
             "onto W_E's row space; not an attack")
        )  # fmt: skip
    rows = []
    for name, guesses, note in references:
        reid = reid_scores(dict(enumerate(guesses)), truths, gallery, flats)
        rows.append(
            {
                **obs.meta,
                "defence": defence_of(obs.config),
                "attack": name,
                "budget": None,
                "psnr": float(np.mean([psnr(g, t) for g, t in zip(guesses, truths, strict=True)])),
                "ssim": float(np.mean([ssim(g, t) for g, t in zip(guesses, truths, strict=True)])),
                **reid,
                "seconds": 0.0,
                "note": note,
            }
        )
    return rows


def run_attack(name: str, attack: Attack, obs: Observation, position: str) -> Reconstruction:
    """One attack on one update; the optimisation attacks show a progress bar of their Adam steps."""
    if attack not in (invert, collusion_inversion):
        return attack(obs)
    with tqdm(total=None, desc=f"{position} {name}", unit="step", leave=False) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        return attack(obs, progress=progress)


OPTIMISING = (invert, collusion_inversion)  # attacks whose strength is a number of optimiser steps


def with_iterations(obs: Observation, steps: int) -> Observation:
    """``obs`` with the optimisation budget set to ``steps`` Adam steps per restart (other audit.* kept)."""
    audit = dataclasses.replace(obs.config.audit, iterations=steps)
    return dataclasses.replace(obs, config=dataclasses.replace(obs.config, audit=audit))


def audit_observations(
    items: list[tuple[Observation, np.ndarray | None]],
    out: Path,
    title: str,
    grid_name: str = "grid.png",
    true_labels: list[np.ndarray | None] | None = None,
    dataset_mean: np.ndarray | None = None,
    gallery: Gallery | None = None,
    budgets: list[int] | None = None,
) -> tuple[list[dict[str, Any]], list[Attacked]]:
    """Attack every observation, score it, write ``audit.md``, ``audit.json`` and the image grid.

    ``items`` pair each observation with its true images (one [C, H, W] image or a batch [n, C, H, W], or None
    when unknown); ``true_labels`` (per item, when known) score the label attack; ``dataset_mean`` adds the
    dataset-mean reference; ``gallery`` adds re-identification among decoys; ``budgets`` runs the optimisation
    attacks once per number of Adam steps (default: each update's ``audit.iterations``). Returns the table rows
    and, per observation, its reconstructions by attack name (the largest budget's, where several ran).
    """
    out.mkdir(parents=True, exist_ok=True)
    rows, images, annotations = [], [], []
    labels = true_labels or [None] * len(items)
    budget_notes = {obs.config.audit.describe() for obs, _ in items}
    if budgets:
        budget_notes = {f"budgets (Adam steps per restart): {', '.join(map(str, budgets))}; otherwise " + b
                        for b in budget_notes}  # fmt: skip
    for k, ((obs, truth), labels_of_batch) in enumerate(
        zip(tqdm(items, desc="audit", unit="update"), labels, strict=True)
    ):
        rows.append(label_row(obs, labels_of_batch))
        recs, ranks = {}, {}
        for name, attack in attacks_for(obs).items():
            steps_list = (budgets or [obs.config.audit.iterations]) if attack in OPTIMISING else [None]
            for steps in steps_list:
                target = obs if steps is None else with_iterations(obs, steps)
                start = time.perf_counter()
                rec = run_attack(name, attack, target, f"update {k + 1}/{len(items)}")
                seconds = time.perf_counter() - start
                scored = score(rec, truth, gallery)
                rows.append(
                    {
                        **obs.meta,
                        "defence": defence_of(obs.config),
                        "attack": name,
                        "budget": steps,
                        "steps-done": rec.steps,
                        "steps-asked": None if steps is None else steps * target.config.audit.restarts,
                        **scored,
                        "seconds": seconds,
                        "note": rec.note,
                    }
                )
                recs[name], ranks[name] = rec, scored["reid-ranks"]
        if truth is not None:
            rows.extend(reference_rows(obs, truth, dataset_mean, gallery))
        images.append((obs, truth, recs))
        annotations.append(ranks)
    report = {
        "title": title,
        "metrics": SETTINGS | {"batch": BATCH_SCORING, "re-identification": reid_setting(gallery)},
        "budget": sorted(budget_notes),
        "rows": rows,
        "summary": summarize(rows),
    }
    atomic_write(out / "audit.json", json.dumps(report, indent=1, default=float).encode())
    atomic_write(out / "audit.md", markdown(report).encode())
    save_grid(images, out / grid_name, annotations)
    return rows, images


def reid_setting(gallery: Gallery | None) -> str:
    """How re-identification was scored (or why it was not), for the report."""
    if gallery is None:
        return "not scored (no decoy gallery)"
    return (
        f"top-1 rate and mean rank of the true image in a gallery of it and up to {len(gallery.decoys)} decoys "
        f"({gallery.source}; the client's own images removed; chance 1/gallery size); similarity: "
        f"{reidentification.SIMILARITY}; each true image's reconstruction is the one matched to it for PSNR"
    )


BATCH_SCORING = (
    "reconstructions matched one to one to the true images (Hungarian assignment on PSNR, scipy); PSNR/SSIM are "
    "means over every true image of the update, an image left unmatched scored as its best flat image"
)


def attack_label(row: dict[str, Any]) -> str:
    """The attack's name with its optimiser budget, where it has one."""
    return row["attack"] + (f" @ {row['budget']} steps" if row.get("budget") else "")


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean PSNR/SSIM, re-identification, label accuracy and time per (defence, setting, attack, budget), over
    the updates that could be attacked."""
    groups: dict[tuple[str, str, str, int | None], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["defence"], row.get("setting", ""), row["attack"], row.get("budget")), []).append(row)
    out = []
    for (defence, setting, attack, budget), members in groups.items():
        scored = [m for m in members if m["psnr"] is not None]
        out.append(
            {
                "defence": defence,
                "setting": setting,
                "attack": attack,
                "budget": budget,
                "updates": len(members),
                "scored": len(scored),
                "psnr": float(np.mean([m["psnr"] for m in scored])) if scored else None,
                "ssim": float(np.mean([m["ssim"] for m in scored])) if scored else None,
                "reid-top1": mean_or_none([m.get("reid-top1") for m in members]),
                "reid-rank": mean_or_none([m.get("reid-rank") for m in members]),
                "reid-chance": mean_or_none([m.get("reid-chance") for m in members]),
                "seconds": float(np.mean([m["seconds"] for m in members])),
                "note": members[0]["note"],
                "label-accuracy": mean_or_none([m.get("label-accuracy") for m in members]),
            }
        )
    return out


def markdown(report: dict[str, Any]) -> str:
    def fmt(v, spec):
        return "—" if v is None else format(v, spec)

    lines = [
        f"# {report['title']}",
        "",
        "## Summary (mean over updates)",
        "",
        "Re-identification: top-1 rate of the true image among the decoy gallery (chance in brackets) and its mean "
        "rank; see the metrics line at the end.",
        "",
        "| defence | setting | attack | updates | matched PSNR (dB) | SSIM | re-identified (chance) | mean rank "
        "| label accuracy | seconds | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["summary"]:
        lines.append(
            f"| {r['defence']} | {r.get('setting', '')} | {attack_label(r)} | {r['updates']} | "
            f"{fmt(r['psnr'], '.1f')} | {fmt(r['ssim'], '.3f')} | {reid_cell(r)} | {fmt(r.get('reid-rank'), '.1f')} "
            f"| {fmt(r.get('label-accuracy'), '.0%')} | {r['seconds']:.3f} | {r['note']} |"
        )
    lines += [
        "",
        "## Every update",
        "",
        "| node | round | image | setting | defence | attack | matched | PSNR (dB) | SSIM | re-identified | mean rank "
        "| seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r.get('partition', '')} | {r.get('round', '')} | {r.get('image', '')} | {r.get('setting', '')} | "
            f"{r['defence']} | {attack_label(r)} | {r.get('matched') or ''} | {fmt(r['psnr'], '.1f')} | "
            f"{fmt(r['ssim'], '.3f')} | {fmt(r.get('reid-top1'), '.0%')} | {fmt(r.get('reid-rank'), '.1f')} | "
            f"{r['seconds']:.3f} |"
        )
    lines += ["", "Metrics: " + "; ".join(f"{k}: {v}" for k, v in report["metrics"].items()), ""]
    lines += ["Optimisation budget: " + "; ".join(report.get("budget", [])), ""]
    return "\n".join(lines)


GRID_IMAGES_PER_UPDATE = 4  # true images shown per update in grid.png (a batch can be larger)


def matched_images(rec: Reconstruction, truths: list[np.ndarray]) -> dict[int, np.ndarray]:
    """The reconstruction assigned to each true image (by index) in the one-to-one matching of :func:`score`."""
    images = rec.all_images
    if not images:
        return {}
    return {j: images[i] for i, j, _ in match_batch(images, truths)}


def save_grid(
    images: list[tuple[Observation, np.ndarray | None, dict[str, Reconstruction]]],
    path: Path,
    ranks: list[dict[str, list[float] | None]] | None = None,
) -> None:
    """One row per true image (up to four per update): original | each attack's reconstruction matched to it
    (blank where an attack could not run or left that image unmatched), with the true image's re-identification
    rank under it where ``ranks`` (per update: attack → per-true-image rank) has one."""
    from core.plots import plt

    if not images:
        return
    ranks = ranks or [{} for _ in images]
    names = list(dict.fromkeys(n for _, _, recs in images for n in recs))
    panels = []  # (row label, truth, {attack: image}, {attack: rank})
    for (obs, truth, recs), update_ranks in zip(images, ranks, strict=True):
        truths = as_batch(truth)
        if truths is None:
            panels.append((obs.meta.get("label", ""), None, {n: r.image for n, r in recs.items()}, {}))
            continue
        matched = {n: matched_images(r, truths) for n, r in recs.items()}
        for j, t in enumerate(truths[:GRID_IMAGES_PER_UPDATE]):
            label = obs.meta.get("label", "") + (f" #{j}" if len(truths) > 1 else "")
            ranked = {n: r[j] for n, r in update_ranks.items() if r is not None and matched[n].get(j) is not None}
            panels.append((label, t, {n: m.get(j) for n, m in matched.items()}, ranked))
    cols = 1 + len(names)
    fig, axes = plt.subplots(len(panels), cols, figsize=(1.6 * cols, 1.7 * len(panels)), squeeze=False)
    for i, (label, truth, recs, ranked) in enumerate(panels):
        for j, (name, img) in enumerate([("original", truth)] + [(n, recs.get(n)) for n in names]):
            ax = axes[i, j]
            ax.axis("off")
            if img is not None:
                ax.imshow(np.transpose(img, (1, 2, 0)))
            if name in ranked:
                ax.text(0.5, -0.04, f"re-id rank {ranked[name]:g}", transform=ax.transAxes, fontsize=5,
                        ha="center", va="top")  # fmt: skip
            if i == 0:
                ax.set_title(textwrap.fill(name, 24), fontsize=6)  # long attack names would overlap
        axes[i, 0].text(-0.1, 0.5, label, transform=axes[i, 0].transAxes, fontsize=6, ha="right", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# ---------------------------------------------------------------------------- captured runs


def observation_from_capture(
    stem: Path, handshake: tuple[dict, dict] | None, controls: dict[int, dict[str, np.ndarray]] | None = None
) -> Observation:
    """Rebuild what the wire observer saw for one train message (``<stem>.json`` + its two safetensors).

    SCAFFOLD: the correction c − c_i uses the server control c of the message and c_i as the observer summed it
    from the client's earlier control-deltas: ``controls`` (partition → c_i; zeros before its first round), which
    this call then advances by the message's own control-delta (captures must come in round order)."""
    manifest = json.loads(stem.with_name(f"{stem.name}.json").read_text())
    config = parse_config(manifest["run_config"])
    sent = unflatten(load_file(stem.with_name(f"{stem.name}.sent.safetensors")))
    received_records = unflatten(load_file(stem.with_name(f"{stem.name}.received.safetensors")))
    received = received_records["arrays"]
    num_classes = int(received[HEAD_BIAS].shape[0])
    expected = {n: tuple(p.shape) for n, p in model_skeleton(config, num_classes).named_parameters()}
    got = {n: tuple(a.shape) for n, a in received.items()}
    if got != expected:
        bad = sorted(set(got.items()) ^ set(expected.items()))[:3]
        raise ValueError(f"{stem}: the capture does not match the model of its run config (e.g. {bad})")
    update, masks = dense_update(sent, expected)
    correction = None
    if config.strategy == "scaffold":
        controls = {} if controls is None else controls
        control, partition = received_records["control"], int(manifest.get("partition", -1))
        mine = controls.get(partition, {})
        correction = {n: control[n] - mine.get(n, np.zeros_like(control[n])) for n in control}
        controls[partition] = {n: mine.get(n, 0) + d for n, d in sent.get("control-delta", {}).items()}
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
        correction=correction,
        meta=meta,
    )


def capture_gallery(items: list[tuple[Observation, np.ndarray | None]], decoys: int) -> Gallery | None:
    """The decoy gallery for a captured run: its dataset's test split at the captured image size. None (said on
    stdout and in the report) when re-identification is off, no ground truth was recorded, or the split cannot
    be loaded here."""
    truths = [truth for _, truth in items if truth is not None]
    if decoys <= 0 or not truths:
        if decoys > 0:
            print("audit: no ground truth recorded: re-identification not scored", flush=True)
        return None
    config = items[0][0].config
    try:
        return reidentification.gallery_from_test_split(config, int(np.asarray(truths[0]).shape[-1]), decoys)
    except (OSError, RuntimeError, ValueError) as err:
        print(f"audit: re-identification not scored: the run's test split cannot be loaded ({err})", flush=True)
        return None


def audit_captures(
    capture_dir: Path,
    out: Path,
    budget: AuditConfig | None = None,
    decoys: int = reidentification.DEFAULT_DECOYS,
    budgets: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Audit every captured train update under ``capture_dir`` (a run's ``captures/`` or the run folder) with the
    optimisation budget ``budget`` (default: the captured run's own ``audit.*`` settings), re-identification
    among ``decoys`` images of the run's test split (0: not scored) and optionally several ``budgets``."""
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
    controls: dict[int, dict[str, np.ndarray]] = {}  # SCAFFOLD: c_i per partition, summed from its control-deltas
    for stem in stems:
        obs = observation_from_capture(stem, handshake, controls)
        if obs.correction is not None:
            if obs.config.capture.rounds or obs.config.capture.partitions:
                obs.meta["note"] = "c_i summed from the captured rounds only (a capture selection was set)"
        if budget is not None:
            obs = dataclasses.replace(obs, config=dataclasses.replace(obs.config, audit=budget))
        if obs.config.encryption.mode == "private-init":
            obs = dataclasses.replace(obs, known_plaintext=None, known_ciphertext=None)  # the pair is not a pair
        truth_path = run / GROUND_TRUTH / stem.parent.name / f"{stem.name}.safetensors"
        recorded = load_file(truth_path) if truth_path.exists() else None
        client = recipe(obs)
        setting = f"round {obs.meta['round']}, B={client.batch}" + (
            ", FedSGD" if client.sends_gradient else f", {client.steps} local steps"
        )
        obs.meta.update({"defence-name": defence_of(obs.config), "setting": setting, "batch-size": client.batch,
                         "local-steps": 1 if client.sends_gradient else client.steps})  # fmt: skip
        items.append((obs, recorded["images"] if recorded is not None else None))
        labels.append(recorded["labels"] if recorded is not None else None)
    print(f"audit: {len(items)} captured update(s) from {capture_dir}", flush=True)
    gallery = capture_gallery(items, decoys)
    rows = audit_observations(
        items, out, f"fedvit audit of {run}", true_labels=labels, gallery=gallery, budgets=budgets
    )[0]
    write_frontier(rows, out, {})
    print((out / "frontier.md").read_text().split("\n## Every attack")[0], flush=True)
    return rows
