"""The audit of any Flower app's captures: label recovery and gradient inversion on the user's own PyTorch model.

Input: captures in the layout of :mod:`attacks.capture` (wire tap, ``capture_mod`` or ``CapturingStrategy``)
and a :class:`attacks.model_spec.ModelSpec`. Per captured train exchange the attacker holds what the node
received (the global arrays, its ConfigRecord, the run config) and what it sent (arrays, metrics) — nothing of
the client's data. Steps:

1. the arrays are mapped onto the model's ``state_dict`` (by name, Flower's ``ArrayRecord(model.state_dict())``
   convention, else by order; one error lists what does not match);
2. the reply is classified: a gradient (FedSGD) or weights after local training (FedAvg-style), by its distance
   to the received weights (overridable);
3. the client's recipe (lr, epochs, local steps, batch size, momentum, examples) is read from the ConfigRecord,
   the run config and the reply's ``num-examples``; every value says where it came from and can be overridden;
4. labels from the last linear layer's bias (:mod:`attacks.labels`), images by the optimisation attack of
   :mod:`attacks.inversion` (Inverting Gradients with the unrolled local steps);
5. with the user's data (a loader per partition and the node → partition mapping), each reconstruction is
   re-identified among the client's own partition and decoys from other partitions; otherwise it is unscored.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.app_captures import (
    NOTHING_ON_THE_WIRE,
    AuditInputError,
    Exchange,
    load_exchanges,
    map_state,
    unreadable_links,
)
from attacks.april import EPS_RANK, lstsq, unpatchify
from attacks.audit import save_grid, score
from attacks.inversion import MatchProblem, noise_start, optimise, steps_note
from attacks.labels import best_counts, label_accuracy, label_counts_unknown_scale, mean_softmax
from attacks.model_spec import ModelSpec, import_callable
from attacks.observation import ClientRecipe, Reconstruction
from attacks.reidentification import DEFAULT_DECOYS, Gallery
from core.config import AuditConfig, is_dataset_name
from core.model import normalize, resolve_device

WEIGHTS_DISTANCE = 0.5  # ‖sent − received‖ / ‖received‖ below this: the reply is weights, above: a gradient
SCORE_FIELDS = ("psnr", "ssim", "reid-top1", "reid-rank", "reid-gallery", "reid-chance")  # None: unscored
RECIPE_KEYS = {  # recipe value -> names apps use for it (ConfigRecord, run config, reply metrics)
    "lr": ("lr", "learning-rate", "learning_rate"),
    "epochs": ("local-epochs", "local_epochs", "epochs"),
    "local-steps": ("local-steps", "local_steps"),
    "batch-size": ("batch-size", "batch_size"),
    "momentum": ("momentum",),
    "num-examples": ("num-examples", "num_examples"),
}


# ---------------------------------------------------------------------------- the model seam


def attack_copy(model: nn.Module, weights: dict[str, np.ndarray]) -> nn.Module:
    """The model with the received weights, set up for the attack: eval mode (no dropout noise) but BatchNorm on
    batch statistics, as the client's training forward used them (running statistics are not tracked, so the
    batched simulation writes no buffers); timm's fused attention switched to the explicit path (double
    backward on CPU); an output object with ``.logits`` (Hugging Face) read as its logits."""
    model = copy.deepcopy(model)
    model.load_state_dict({n: torch.as_tensor(np.array(w)) for n, w in weights.items()}, strict=False)
    model = model.float().eval()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.track_running_stats = False
            module.running_mean = module.running_var = None
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    for p in model.parameters():
        p.requires_grad_(False)
    model.register_forward_hook(_logits_only)
    return model


def _logits_only(module: nn.Module, inputs: Any, output: Any) -> Any:
    """Hugging Face models return an output object; the attacks need the logits tensor."""
    return output.logits if hasattr(output, "logits") else output


def head_bias(model: nn.Module) -> str | None:
    """The bias of the model's last ``nn.Linear`` (the classifier, whose gradient gives the labels away)."""
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            last = f"{name}.bias"
    return last


def vit_structure(model: nn.Module) -> str | None:
    """Why APRIL does not apply (None when the model has a ViT's patch embedding and position embedding)."""
    names = dict(model.named_parameters())
    if "pos_embed" in names and "patch_embed.proj.weight" in names:
        return None
    return "no patch embedding and position embedding (APRIL's closed forms need a ViT's)"


# breaching's Inverting Gradients recipe in fedvit's units: TV 0.2 on a 0.5-std normalised scale is 0.4 here, its
# Gaussian start and its kept candidate (lowest total objective); it led on the CNN and ResNet-18 (peer tables)
OTHER_SETTINGS: dict[str, Any] = {"tv": 0.4, "init": "gaussian", "keep": "objective"}


def model_settings(model: nn.Module) -> tuple[dict[str, Any], str]:
    """The optimisation attack's TV weight, start and kept candidate for ``model`` (AuditConfig fields) and why:
    AuditConfig's defaults (tuned on fedvit's ViTs) where the model has a ViT's embeddings, else
    :data:`OTHER_SETTINGS`."""
    if vit_structure(model) is None:
        defaults = AuditConfig()
        return {key: getattr(defaults, key) for key in OTHER_SETTINGS}, "tuned on ViTs"
    return dict(OTHER_SETTINGS), "breaching's recipe, which led on a CNN and a ResNet-18; not a ViT"


def embedding_route(model: nn.Module, spec: ModelSpec, gradient: dict[str, np.ndarray]) -> Reconstruction:
    """APRIL-E on the user's ViT (april.md §3.1, as :func:`attacks.april.embedding_route`): X = (G_pᵀ)⁺ ∂L/∂W_E
    from the position- and patch-embedding gradients of one image; ``gradient`` may be off by a scale
    (a one-step weight change), which least squares ignores."""
    g = gradient["pos_embed"][0].astype(np.float64)  # [prefix + N, D]
    dw = gradient["patch_embed.proj.weight"]
    c, h, w = spec.input_shape
    p = int(dw.shape[-1])
    patches = (h // p) * (w // p)
    gp = g[g.shape[0] - patches :]  # rows of the patch tokens (the class token's row, if any, comes first)
    if not np.any(gp):
        return Reconstruction(None, "no position-embedding gradient in the payload")
    x = lstsq(gp.T, dw.reshape(dw.shape[0], -1).astype(np.float64))  # [N, C·P·P], normalised pixels
    rank = np.linalg.matrix_rank(gp, tol=EPS_RANK * np.abs(gp).max() * max(gp.shape))
    image = unpatchify(x, (c, h, w, p), np.asarray(spec.mean), np.asarray(spec.std))
    return Reconstruction(image, f"APRIL-E closed form, rank G_p = {rank} of N = {patches}", images=(image,))


def april_status(model: nn.Module, rec: ClientRecipe) -> str | None:
    """Why APRIL-E cannot run on this update (None when it can: a ViT, one image, one step)."""
    if vit_structure(model):
        return vit_structure(model)
    if rec.examples != 1 or rec.steps != 1:
        return (
            f"APRIL's closed forms invert one image's gradient; this update holds {rec.examples} image(s) over "
            f"{rec.steps} step(s)"
        )
    return None


# ---------------------------------------------------------------------------- the client's recipe


def sent_kind(received: dict[str, np.ndarray], sent: dict[str, np.ndarray], names: list[str]) -> tuple[str, float]:
    """("weights" | "gradient", ‖sent − received‖ / ‖received‖ over the parameters): weights after local
    training stay close to what was received; a gradient is a different vector altogether."""
    diff = sum(float(np.sum((sent[n].astype(np.float64) - received[n]) ** 2)) for n in names)
    norm = sum(float(np.sum(received[n].astype(np.float64) ** 2)) for n in names)
    distance = math.sqrt(diff) / max(math.sqrt(norm), 1e-12)
    return ("weights" if distance < WEIGHTS_DISTANCE else "gradient"), distance


@dataclasses.dataclass(frozen=True)
class AppRecipe:
    """The client's local work as the attacker reads it, each value with where it came from."""

    recipe: ClientRecipe
    lr_known: bool
    sources: dict[str, str]

    def describe(self) -> str:
        return "; ".join(f"{k} {v}" for k, v in self.sources.items())


def read_recipe(ex: Exchange, kind: str, overrides: dict[str, str]) -> AppRecipe:
    """The recipe from (first found) the overrides, the received ConfigRecord, the run config, the reply's
    metrics; defaults: full batch, one epoch, no momentum. ``local-steps`` (when given) fixes the images
    processed to steps × batch size."""
    found: dict[str, tuple[float, str]] = {}
    for key, aliases in RECIPE_KEYS.items():
        sources = [("override", overrides), ("ConfigRecord", ex.received_config), ("run config", ex.run_config),
                   ("reply metrics", ex.sent_metrics)]  # fmt: skip
        for source, values in sources:
            hit = next((values[a] for a in (key, *aliases) if a in values and values[a] not in ("", None)), None)
            if hit is not None:
                try:
                    found[key] = (float(hit), source)
                except (TypeError, ValueError) as err:
                    raise AuditInputError(f"{ex.label}: {key} = {hit!r} ({source}) is not a number") from err
                break
    sources: dict[str, str] = {}

    def take(key: str, default: float | None, why: str) -> float | None:
        if key in found:
            value, source = found[key]
            sources[key] = f"{value:g} ({source})"
            return value
        sources[key] = f"{default:g} ({why})" if default is not None else f"unknown ({why})"
        return default

    examples = take("num-examples", None, "not sent")
    batch = take("batch-size", examples, "assumed: the whole local dataset")
    if examples is None and batch is None:
        raise AuditInputError(f"{ex.label}: neither num-examples nor batch-size is known: give --recipe batch-size=B")
    steps = take("local-steps", None, "from epochs") if "local-steps" in found else None
    if steps is not None:
        examples = int(steps) * int(batch)
        sources["num-examples"] = f"{examples} (local-steps × batch-size)"
    examples = int(examples if examples is not None else batch)
    batch = int(min(batch or examples, examples))
    if kind == "gradient":  # FedSGD: one step on every example; lr, epochs and momentum play no part
        sources["sent"] = "a gradient: one step on all examples"
        return AppRecipe(ClientRecipe(examples, examples, 1, 0.0, 0.0, 0.0, 0, True), True, sources)
    epochs = 1 if steps is not None else int(take("epochs", 1, "assumed"))
    lr = take("lr", None, "scale estimated for labels; 0.01 simulated")
    momentum = take("momentum", 0.0, "assumed plain SGD") or 0.0
    rec = ClientRecipe(examples, batch, epochs, 0.01 if lr is None else lr, momentum, 0.0, 0, False)
    return AppRecipe(rec, lr is not None, sources)


# ---------------------------------------------------------------------------- the attacks


def recover_app_labels(
    model: nn.Module, spec: ModelSpec, target: dict[str, np.ndarray], app: AppRecipe
) -> tuple[np.ndarray | None, str]:
    """Label counts from the head-bias row of the observed gradient (or weight change), or None and why."""
    bias = head_bias(model)
    if bias is None or bias not in target:
        return None, "no final linear layer with a bias"
    rec = app.recipe
    probs = mean_softmax(model, spec.input_shape)
    if rec.sends_gradient:
        return best_counts(target[bias], rec.examples, probs)
    if not app.lr_known:  # Δb = lr · steps · ḡ with lr unknown: the scale that makes the counts integral
        return label_counts_unknown_scale(target[bias] / rec.steps, rec.examples, probs), "lr unknown: scale estimated"
    step_lr = rec.lr / (1.0 - rec.momentum)
    return best_counts(target[bias] / (step_lr * rec.steps), rec.examples, probs)


def invert_app_update(
    model: nn.Module,
    spec: ModelSpec,
    target: dict[str, np.ndarray],
    rec: ClientRecipe,
    counts: np.ndarray | None,
    budget: AuditConfig,
    device: torch.device,
    progress: Callable[[int, int], None] | None = None,
    seed: int = 0,
) -> Reconstruction:
    """The optimisation attack (attacks.inversion.optimise) on the user's model: candidates through the client's
    recipe until the simulated update matches ``target`` (gradient, or received − sent weights)."""
    model = model.to(device)
    probe = torch.zeros(2, *spec.input_shape, device=device)  # two images: BatchNorm on batch statistics needs them
    num_classes = int(model(normalize(model, probe)).shape[-1])
    if counts is not None and int(counts.sum()) == rec.examples:
        labels = torch.full((rec.examples, num_classes), -30.0)
        labels[torch.arange(rec.examples), torch.as_tensor(np.repeat(np.arange(len(counts)), counts))] = 30.0
        learn, label_note = False, "labels from the head-bias gradient"
    else:
        labels, learn, label_note = torch.zeros(rec.examples, num_classes), True, "labels learned"
    generator = torch.Generator().manual_seed(seed)
    shape = (budget.restarts, rec.examples, *spec.input_shape)
    starts = noise_start(budget.init, shape, model, generator)  # normalize reads only the model's statistics
    names = [n for n, _ in model.named_parameters()]
    problem = MatchProblem(
        model=model,
        params={n: p.detach().requires_grad_(True) for n, p in model.named_parameters()},
        target={n: torch.as_tensor(target[n], dtype=torch.float32, device=device) for n in names},
        kept=None,
        recipe=rec,
        labels=labels,
        learn_labels=learn,
        starts=starts,
        start_notes=[f"random start; {label_note}"] * budget.restarts,
    )
    images, note, match_value, done = optimise(problem, budget, device, progress)
    note += "; " + steps_note(budget, rec, match_value, done)
    batch = images.cpu().numpy().astype(np.float64)
    return Reconstruction(batch[0], note, images=tuple(batch), steps=done)


# ---------------------------------------------------------------------------- the user's data


@dataclasses.dataclass(frozen=True)
class UserData:
    """The client data that scores reconstructions, and the node → partition mapping.

    ``source`` is either the user's loader (``package.module:callable``, ``callable(partition_id) -> (images
    [N, C, H, W] in [0, 1], labels [N])``; decoys: the other partitions named in ``partitions`` and
    ``decoy_partitions``) or a fedvit dataset name as ``data.name`` takes it, partitioned as fedvit's own app
    partitions it (``settings``: further ``data.*`` keys and ``seed``; ``num_partitions``, else the count the
    captured node config recorded; decoys: the dataset's test split)."""

    source: str
    partitions: dict[str, int]
    decoy_partitions: tuple[int, ...] = ()
    app_dir: str | None = None
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_partitions: int | None = None
    image_size: int = 32  # a named dataset's images are resized to the model's input (square)
    _loaded: dict[int, tuple[np.ndarray, np.ndarray]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )
    _galleries: dict[int, Gallery] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def named(self) -> bool:
        return is_dataset_name(self.source)

    def config(self) -> Any:
        """The fedvit Config of a named dataset (its errors name the key that is wrong)."""
        from core.config import ConfigError, parse_config

        keys = {("seed" if k == "seed" else f"data.{k}"): v for k, v in self.settings.items()}
        try:
            return parse_config({"data.name": self.source} | keys)
        except ConfigError as err:
            raise AuditInputError(f"--data {self.source}: {err}") from None

    def load(self, partition: int, recorded_partitions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One partition's images and labels, each partition loaded once per audit."""
        if partition not in self._loaded:
            if self.named:
                images, labels = self._named_partition(partition, self.num_partitions or recorded_partitions)
            else:
                images, labels = import_callable(self.source, self.app_dir, "--data")(partition)
            images = np.asarray(images, dtype=np.float64)
            if images.ndim != 4 or images.min() < 0 or images.max() > 1:
                raise AuditInputError(f"--data {self.source}({partition}) must return images [N, C, H, W] in [0, 1]")
            self._loaded[partition] = (images, np.asarray(labels, dtype=np.int64))
        return self._loaded[partition]

    def _named_partition(self, partition: int, count: int | None) -> tuple[np.ndarray, np.ndarray]:
        from core.data import DatasetUnavailableError, client_data

        if count is None:
            raise AuditInputError(
                f"--data {self.source}: how many partitions the data was split into is unknown (the captures did "
                "not record the node config's num-partitions): give --num-partitions"
            )
        config = self.config()
        try:
            part = client_data(config.data, config.seed, partition, count)
        except (DatasetUnavailableError, ValueError) as err:
            raise AuditInputError(f"--data {self.source}, partition {partition} of {count}: {err}") from None
        x, y = part.images.batch(part.train, self.image_size)
        return x.numpy(), y.numpy()


def gallery_for(data: UserData, own: int, size: tuple[int, ...]) -> Gallery:
    """Decoys for partition ``own``: a named dataset's test split (99 images), else every image of the other
    partitions (mapped and decoy), at most 99."""
    if data.named:  # the same decoys for every partition: built once per audit
        from attacks.reidentification import gallery_from_test_split

        if size[-1] not in data._galleries:
            data._galleries[size[-1]] = gallery_from_test_split(data.config(), int(size[-1]))
        return data._galleries[size[-1]]
    decoys = []
    for pid in sorted(set(data.partitions.values()) | set(data.decoy_partitions)):
        if pid != own:
            images = data.load(pid)[0]
            decoys.extend(im for im in images if im.shape == tuple(size))
    decoys = decoys[:DEFAULT_DECOYS]
    stacked = np.stack(decoys) if decoys else np.zeros((0, *size))
    return Gallery(stacked, f"{len(decoys)} images of other partitions ({data.source})")


# ---------------------------------------------------------------------------- the report


def verdict(rows: list[dict[str, Any]]) -> str:
    """One line: what the captures give away (labels, images), scored where the user's data allowed."""
    if not rows:
        return NOTHING_ON_THE_WIRE
    labels = [r for r in rows if r["labels"] is not None]
    scored = [r for r in rows if r.get("reid-top1") is not None]
    parts = [f"labels recovered for {len(labels)} of {len(rows)} update(s)"]
    exact = [r for r in labels if r.get("label-accuracy") is not None]
    if exact:
        parts[0] += f" ({sum(r['label-accuracy'] == 1.0 for r in exact)} of {len(exact)} exactly right)"
    if scored:
        top1 = float(np.mean([r["reid-top1"] for r in scored]))
        chance = float(np.mean([r["reid-chance"] for r in scored]))
        psnr = float(np.mean([r["psnr"] for r in scored]))
        parts.append(f"images re-identified {top1:.0%} top-1 (chance {chance:.0%}), matched PSNR {psnr:.1f} dB")
        leaks = bool(labels) or top1 > 2 * chance
    else:
        parts.append("images unscored (no --data)")
        leaks = bool(labels)
    return ("LEAKS: " if leaks else "no leak found: ") + "; ".join(parts)


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# fedvit audit of {report['captures']}", "", f"**Verdict:** {report['verdict']}", ""]
    lines += [f"Model: {report['model']}", "", f"Budget: {report['budget']}", ""]
    if report["rows"]:
        lines += ["| update | sent | B × steps | labels (recovered) | PSNR dB (best attack) | SSIM | re-id top-1 "
                  "| rank |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in report["rows"]:

            def fmt(key: str, spec: str, row: dict[str, Any] = r) -> str:
                return "unscored" if row.get(key) is None else format(row[key], spec)

            labels = "—" if r["labels"] is None else str(r["labels"])
            lines.append(
                f"| {r['update']} | {r['sent']} | {r['batch']} × {r['steps']} | {labels} | {fmt('psnr', '.2f')} "
                f"| {fmt('ssim', '.3f')} | {fmt('reid-top1', '.0%')} | {fmt('reid-rank', '.1f')} |"
            )
        lines += ["", "## Attacks per update", ""]
        for r in report["rows"]:
            lines.append(f"- **{r['update']}**: recipe: {r['recipe']}")
            for name, status in r["attacks"].items():
                lines.append(f"  - {name}: {status}")
            for name, scores in r.get("per-attack", {}).items():
                lines.append(f"  - scored {name}: {scores['psnr']:.2f} dB, re-identified {scores['reid-top1']:.0%}")
    for note in report["notes"]:
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def attack_exchange(
    ex: Exchange,
    base: nn.Module,
    spec: ModelSpec,
    budget: AuditConfig,
    overrides: dict[str, str],
    sent_as: str,
    device: torch.device,
    progress: Callable[[int, int], None],
    seed: int,
) -> tuple[dict[str, Any], np.ndarray | None, dict[str, Reconstruction]]:
    """Every attack that applies to one exchange: its report row, the recovered label counts, and each attack's
    reconstruction by name."""
    names = [n for n, _ in base.named_parameters()]
    received = map_state(ex.received, base, f"{ex.label} (received)")
    sent = map_state(ex.sent, base, f"{ex.label} (sent)")
    kind, distance = sent_kind(received, sent, names)
    kind = kind if sent_as == "auto" else sent_as
    app = read_recipe(ex, kind, overrides)
    model = attack_copy(base, received)
    target = {n: (sent[n] if kind == "gradient" else received[n] - sent[n]).astype(np.float32) for n in names}
    started = time.monotonic()
    counts, label_note = recover_app_labels(model, spec, target, app)
    images = invert_app_update(model, spec, target, app.recipe, counts, budget, device, progress, seed)
    not_april = april_status(model, app.recipe)
    closed = None if not_april else embedding_route(model, spec, target)
    row = {
        "update": ex.label,
        "sent": f"{kind} (distance {distance:.3g})" + ("" if sent_as == "auto" else ", as told"),
        "batch": app.recipe.batch,
        "steps": app.recipe.steps,
        "examples": app.recipe.examples,
        "recipe": app.describe(),
        "labels": None if counts is None else {int(c): int(n) for c, n in enumerate(counts) if n},
        "seconds": round(time.monotonic() - started, 1),
        "attacks": {
            "label recovery (head-bias gradient)": (
                f"applied{f' ({label_note})' if label_note else ''}"
                if counts is not None
                else f"not applicable: {label_note}"
            ),
            "optimisation (Inverting Gradients, unrolled local steps)": f"applied: {images.note}",
            "APRIL closed forms": f"not applicable: {not_april}" if not_april else f"applied: {closed.note}",
        },
    } | dict.fromkeys(SCORE_FIELDS)
    reconstructions = {"inversion": images} | ({"APRIL-E": closed} if closed and closed.image is not None else {})
    return row, counts, reconstructions


def audit_app_captures(
    captures: Path,
    out: Path,
    spec: ModelSpec,
    budget: AuditConfig,
    overrides: dict[str, str] | None = None,
    sent_as: str = "auto",
    data: UserData | None = None,
    device: str = "auto",
    tv_by_model: bool = False,
) -> dict[str, Any]:
    """Audit every captured train exchange under ``captures`` with the user's model; writes ``audit.md``,
    ``audit.json`` and ``grid.png`` under ``out`` and returns the report. The start and kept candidate are
    :func:`model_settings`' choice for the model, and so is the TV weight with ``tv_by_model`` (no ``--tv``)."""
    if not captures.exists():
        raise AuditInputError(f"no such folder: {captures}")
    exchanges, skipped = load_exchanges(captures)
    hidden = unreadable_links(captures)
    notes = [f"skipped {s}" for s in skipped]
    if hidden:
        notes.append(f"{hidden} link(s) were TLS or HTTP/2: relayed as bytes, only connection metadata recorded")
    if not exchanges and not hidden:
        own = (
            " (these are fedvit's own captures: audit them without --model)"
            if any(captures.rglob("partition-*.json"))
            else ""
        )
        raise AuditInputError(f"no captured train exchanges (node-<id>.json) under {captures}{own}")
    out.mkdir(parents=True, exist_ok=True)
    tv_note = ""
    if exchanges:
        base = spec.build(num_classes=int(list(exchanges[0].received.values())[-1].shape[0]))
        print(f"audit: {len(exchanges)} captured update(s) under {captures}; model {spec.factory}", flush=True)
        settings, why = model_settings(base)
        if tv_by_model:
            tv_note = f" ({why}; --tv sets the weight)"
        else:  # the user's --tv stands; the start and kept candidate still follow the model
            settings.pop("tv")
            tv_note = " (--tv)"
        budget = dataclasses.replace(budget, **settings)
    start = "Gaussian start on the normalised scale" if budget.init == "gaussian" else "uniform start"
    budget_text = (
        f"{budget.iterations} Adam steps × {budget.restarts} restart(s), ≤ {budget.max_seconds:g} s per update, "
        f"step {budget.lr:g}, TV {budget.tv:g}{tv_note}, {start}, keeps the lowest "
        + ("gradient match" if budget.keep == "match" else "total objective")
    )
    report: dict[str, Any] = {"captures": str(captures), "model": spec.describe(), "budget": budget_text}
    rows, grid_items = [], []
    run_device = resolve_device(device)
    for index, ex in enumerate(exchanges, 1):
        prefix = f"audit: [{index}/{len(exchanges)}] {ex.label}:"

        def progress(done: int, total: int, prefix: str = prefix) -> None:
            if done == total or done % max(total // 4, 1) == 0:
                print(f"{prefix} {done}/{total} Adam steps", flush=True)

        row, counts, reconstructions = attack_exchange(
            ex, base, spec, budget, overrides or {}, sent_as, run_device, progress, seed=index
        )
        truth, partition = None, None if data is None else data.partitions.get(str(ex.node), ex.partition)
        if partition is not None:
            truth, own_labels = data.load(partition, ex.num_partitions)
            gallery = gallery_for(data, partition, truth.shape[1:])
            scored = {name: score(rec, truth, gallery) for name, rec in reconstructions.items()}
            best = max(scored, key=lambda name: scored[name]["psnr"])  # the row reports the strongest attack
            row |= {k: scored[best][k] for k in SCORE_FIELDS} | {"partition": partition, "best-attack": best}
            row["per-attack"] = {name: {k: v[k] for k in ("psnr", "reid-top1")} for name, v in scored.items()}
            if len(truth) != row["examples"]:  # which of the partition's images the update used is unknown
                notes.append(
                    f"{ex.label}: partition {partition} holds {len(truth)} images, the update {row['examples']}: "
                    "each reconstruction is scored against its closest partition image (optimistic); labels unscored"
                )
            elif counts is not None:
                row["label-accuracy"] = label_accuracy(counts, own_labels)
        elif data is not None:
            notes.append(f"{ex.label}: no partition known for node {ex.node} (give --partition NODE=ID): unscored")
        rows.append(row)
        grid_items.append((SimpleNamespace(meta={"label": f"r{ex.round} n{ex.node}"}), truth, reconstructions))
        scored = "unscored" if row["psnr"] is None else f"PSNR {row['psnr']:.2f} dB, re-id top-1 {row['reid-top1']:.0%}"
        print(f"{prefix} labels {row['labels']}; {scored}", flush=True)
    report |= {"verdict": verdict(rows), "rows": rows, "notes": notes}
    _write(report, out, grid_items)
    print(f"audit: {report['verdict']}", flush=True)
    return report


def _write(report: dict[str, Any], out: Path, grid_items: list) -> None:
    (out / "audit.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "audit.md").write_text(markdown(report))
    if grid_items:
        save_grid(grid_items, out / "grid.png")
