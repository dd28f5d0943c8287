"""The client's local training as the audit simulates it on auxiliary images, and how well that simulation
reproduces the update it stands for (:class:`RecipeFit`). The label-count estimate, the membership shadows and the
power twin all run :func:`simulate`; every figure they give rests on the recipe fitting.

Under SGD with momentum β (PyTorch's form, no dampening) step t's gradient is applied w_t = (1 − β^{T−t+1}) / (1 − β)
times over T steps (:func:`step_weights`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from fedvit.attacks.holdings import Auxiliary
from fedvit.attacks.local_sgd import ADAMW_WEIGHT_DECAY, DpSgd, local_sgd
from fedvit.capture.reader import AuditInputError
from fedvit.core.model import normalize
from fedvit.observed.augmentation import augmented
from fedvit.observed.observation import (
    Observation,
    explicit_attention,
    input_shape,
    received_model,
    recipe,
    trained_names,
)
from fedvit.observed.recipe import SIMULATED_OPTIMISERS


def step_weights(steps: int, momentum: float) -> np.ndarray:
    """w_t = (1 − β^{T−t+1}) / (1 − β): how much of step t's gradient the T momentum steps applied in total."""
    if momentum == 0:
        return np.ones(steps)
    remaining = np.arange(steps, 0, -1)
    return (1 - momentum**remaining) / (1 - momentum)


@dataclasses.dataclass(frozen=True)
class Simulation:
    """One simulated local training, as the rows of the linear system in the counts n: ``system`` [R, C] such that
    ``system @ n ≈ N (w_sent − w_received) / (lr W)`` (:func:`scaled_rhs`) stacked over the head's bias and weight
    rows; and what :class:`RecipeFit` compares with the update."""

    system: np.ndarray
    weights: dict[str, np.ndarray] | None = None  # the simulated client's final state dict (``keep_weights``)
    snapshots: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)  # parameters (``snapshots``)
    drawn: np.ndarray | None = None  # the auxiliary images it trained on, by index (-1: noise for a class aux lacks)
    head_delta: np.ndarray | None = None  # the head's simulated change, laid out as :func:`head_rows`
    update_norm: float = math.nan  # ‖w_end − w_received‖ over every trained parameter


def head_module(model: torch.nn.Module, bias: str) -> torch.nn.Module:
    """The module that owns the head's bias (``fc3.bias`` → ``fc3``)."""
    return model.get_submodule(bias.removesuffix(".bias"))


def simulate(
    obs: Observation, aux: Auxiliary, counts: np.ndarray, momentum: float, seed: int, weight_decay: float = 0.0,
    keep_weights: bool = False, snapshots: int = 0, private: bool = False,
) -> Simulation:  # fmt: skip
    """The client's T local steps (its batch size, lr, momentum) from the received weights on auxiliary images:
    ``counts`` images per class, each drawn once from the auxiliary images of its class and revisited every epoch.

    Per class k it averages, weighted by w_t / B_t over the class-k images it trains on: their softmax (P̄[:, k]),
    their head inputs h (F_k) and p_c·h (M[c, k]). With n_k/N of every batch from class k, row c of the head
    moves by  w_sent − w_received ≈ lr W/N · Σ_k n_k (δ_ck [1, F_k] − [P̄[c, k], M[c, k]]):  the system returned
    holds those coefficients (bias row first, then the weight rows, per class).

    ``private``: the steps are DP-SGD's where the client claims it (noise multiplier and clipping norm on record),
    and the clipped update gets LocalDpMod's noise where it claims that: what a shadow update or the power twin must
    repeat. The label estimate's own simulations run the plain steps — its relation is SGD's update, marked
    unverified under DP-SGD — at a fraction of the cost (no per-image gradients).
    """
    client = recipe(obs)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    views = torch.Generator().manual_seed(seed + 1)  # the declared augmentation's draws (a fresh view per visit)
    model = received_model(obs).float().train()
    shape = input_shape(obs)
    arrange = channels_last if takes_channels_last(model, shape) else contiguous
    features: list[torch.Tensor] = []
    recording = [True]  # off while DP-SGD's per-image gradients run (vmapped tensors must not leave the transform)
    hook = head_module(model, obs.head_bias).register_forward_hook(
        lambda m, i, o: features.append(i[0].detach()) if recording[0] else None)  # fmt: skip
    classes = len(counts)
    labels = np.repeat(np.arange(classes), counts)
    by_class = {k: np.flatnonzero(aux.labels == k) for k in range(classes)}
    drawn, pool = np.full(len(labels), -1, dtype=np.int64), []
    for j, k in enumerate(labels):  # one draw per image, in label order (a class aux lacks: noise)
        if len(by_class[k]):
            drawn[j] = rng.choice(by_class[k])
            pool.append(aux.images[drawn[j]])
        elif aux.noise is not None:
            pool.append(aux.noise[rng.integers(len(aux.noise))])
        else:
            pool.append(rng.random(shape))
    images = torch.as_tensor(np.stack(pool), dtype=torch.float32)
    targets = torch.as_tensor(labels)
    bias, weight = obs.head_bias, head_weight(obs.head_bias)
    trained = set(trained_names(obs))  # a partial update: the frozen layers stay as received
    params = {n: p.detach() for n, p in model.named_parameters() if n in trained}
    per_epoch = math.ceil(len(labels) / client.batch)
    weights = step_weights(per_epoch * client.epochs, momentum)
    seen, probs_sum, feat_sum, cross_sum = np.zeros(classes), None, None, None
    kept = []
    snapshot_steps = set(np.linspace(0, per_epoch * client.epochs, snapshots, endpoint=False).round().astype(int))
    schedule = [  # (step, batch): the client's shuffled order, drawn afresh every epoch
        (epoch * per_epoch + k, order[first : first + client.batch])
        for epoch, order in enumerate(torch.randperm(len(labels), generator=generator) for _ in range(client.epochs))
        for k, first in enumerate(range(0, len(labels), client.batch))
    ]

    def batch_loss(current: dict[str, torch.Tensor], step_batch: tuple[int, torch.Tensor]) -> torch.Tensor:
        """The step's cross-entropy; records the step's softmax and head inputs per class on the way."""
        nonlocal seen, probs_sum, feat_sum, cross_sum
        step, batch = step_batch
        if step in snapshot_steps:
            kept.append({n: w.detach().numpy().copy() for n, w in current.items()})
        features.clear()
        x = images[batch] if client.augment is None else augmented(images[batch], client.augment, views)
        inputs[:] = [x, targets[batch]]
        logits = torch.func.functional_call(model, current, (normalize(model, arrange(x)),))
        scale = weights[step] / len(batch)
        probs = torch.softmax(logits.detach().double(), 1).numpy()
        h = features[-1].double().flatten(1).numpy()
        y = targets[batch].numpy()
        if probs_sum is None:
            probs_sum = np.zeros((classes, classes))
            feat_sum = np.zeros((classes, h.shape[1]))
            cross_sum = np.zeros((classes, classes, h.shape[1]))
        # per class k of the batch's images, weighted: one-hot products (np.add.at is ~10x slower at these sizes)
        onehot = np.zeros((len(y), classes))
        onehot[np.arange(len(y)), y] = scale
        seen += onehot.sum(0)
        probs_sum += probs.T @ onehot  # column k: the softmax of class-k images
        feat_sum += onehot.T @ h
        cross_sum += (onehot.T @ (probs[:, :, None] * h[:, None, :]).reshape(len(y), -1)).reshape(
            classes, classes, -1).transpose(1, 0, 2)  # fmt: skip
        return F.cross_entropy(logits, targets[batch])

    inputs: list[torch.Tensor] = []  # the last step's (views of the) images and labels, for DP-SGD

    def per_sample(current: dict[str, torch.Tensor], step_batch: tuple[int, torch.Tensor]) -> dict[str, torch.Tensor]:
        def loss(w: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(torch.func.functional_call(model, w, (normalize(model, x[None]),)), y[None])

        recording[0] = False
        try:
            return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(current, *inputs)
        finally:
            recording[0] = True

    dp_sgd = None
    if private and (claim := client.privacy) is not None and claim.noise_multiplier is not None and claim.clipping_norm:
        explicit_attention(model)  # timm's fused attention has no batching rule
        dp_sgd = DpSgd(claim.noise_multiplier, claim.clipping_norm, per_sample,
                       torch.Generator().manual_seed(seed + 2))  # fmt: skip
    # an optimiser not simulated: SGD's steps (the counts are then marked unverified; shadows do not run)
    optimiser = client.optimiser if client.optimiser in SIMULATED_OPTIMISERS else "sgd"
    if optimiser == "adamw" and weight_decay == 0:
        weight_decay = ADAMW_WEIGHT_DECAY  # torch's default (no record carries the weight decay)
    end = local_sgd(params, batch_loss, schedule, client.lr, momentum, weight_decay=weight_decay, optimiser=optimiser,
                    dp_sgd=dp_sgd)  # fmt: skip
    if client.update_clip is not None:  # Flower's client-side clipping: the whole update scaled to norm ≤ C
        end = clipped_update(params, end, client.update_clip)
    if private and client.update_noise is not None:  # LocalDpMod: then Gaussian noise on every entry
        draws = torch.Generator().manual_seed(seed + 3)
        end = {n: w + client.update_noise * torch.randn(w.shape, generator=draws, dtype=w.dtype)
               for n, w in end.items()}  # fmt: skip
    hook.remove()
    # per class k, the mean over its occurrences (classes never drawn: the mean over every image seen)
    norm = np.maximum(seen, 1e-12)
    fallback = seen == 0
    p_mean = probs_sum / norm
    f_mean = feat_sum / norm[:, None]
    m_mean = cross_sum / norm[None, :, None]
    p_mean[:, fallback] = (probs_sum.sum(1) / max(seen.sum(), 1e-12))[:, None]
    f_mean[fallback] = feat_sum.sum(0) / max(seen.sum(), 1e-12)
    m_mean[:, fallback] = (cross_sum.sum(1) / max(seen.sum(), 1e-12))[:, None]
    eye = np.eye(classes)
    bias_rows = eye - p_mean  # [c, k]
    weight_rows = eye[:, :, None] * f_mean[None, :, :] - m_mean  # [c, k, d]
    system = np.concatenate([bias_rows[:, None, :], weight_rows.transpose(0, 2, 1)], axis=1).reshape(-1, classes)
    moved_all = math.sqrt(sum(float((end[n].detach() - params[n]).pow(2).sum()) for n in end))
    delta = None
    if bias in params and weight in params:  # laid out as head_rows: per class its bias, then its weight row
        moved = [(end[n].detach() - params[n]).double().numpy() for n in (bias, weight)]
        delta = np.concatenate([m.reshape(len(moved[0]), -1) for m in moved], 1).reshape(-1)
    final = None
    if keep_weights:  # the state dict: the trained parameters with the model's buffers
        final = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
        final.update({n: w.detach().numpy().copy() for n, w in end.items()})
    return Simulation(system, final, kept, drawn, delta, moved_all)


def channels_last(images: torch.Tensor) -> torch.Tensor:
    """Images [B, C, H, W] laid out channels-last in memory, the same values: PyTorch's CPU convolution and pooling
    kernels run fedvit's test CNN 9% sooner per step on it, fedvit's tiny ViT and ResNet-18 as fast
    (benchmarks/simulation_step.py). Results differ from the default layout by float rounding only; a model that
    refuses the layout (Flower's quickstart CNN reshapes with ``x.view``) gets :func:`contiguous`
    (:func:`takes_channels_last`)."""
    return images.contiguous(memory_format=torch.channels_last) if images.dim() == 4 else images


def contiguous(images: torch.Tensor) -> torch.Tensor:
    """Images in PyTorch's default layout (what every model accepts)."""
    return images.contiguous()


_LAYOUT_CHECKS: dict[tuple[type, tuple[int, ...]], bool] = {}


def takes_channels_last(model: torch.nn.Module, shape: tuple[int, ...]) -> bool:
    """Whether ``model`` gives on channels-last images (:func:`channels_last`) what it gives on the default layout,
    checked once per model class and input shape on two seeded images in eval mode: ``x.view(-1, 400)`` after the
    convolutions (Flower's quickstart CNN) raises on the permuted memory, and a model that reads its input's memory
    order would silently differ; either way the simulation falls back to the default layout, whose figures are the
    ones the layout only speeds up. A model that fails on the default layout too raises :class:`ModelInputError`."""
    key = (type(model), tuple(shape))
    if key not in _LAYOUT_CHECKS:
        plain = trial_logits(model, shape)
        try:
            fast = trial_logits(model, shape, "channels-last")
            same = bool(torch.allclose(fast, plain, rtol=1e-4, atol=1e-5))
        except ModelInputError:  # e.g. "view size is not compatible with input tensor's size and stride"
            same = False
        _LAYOUT_CHECKS[key] = same
    return _LAYOUT_CHECKS[key]


def trial_logits(model: torch.nn.Module, shape: tuple[int, ...], layout: str = "contiguous") -> torch.Tensor:
    """``model``'s logits on two seeded images of ``shape`` (pixels in [0, 1]), in eval mode without gradients, its
    mode restored after; ``layout`` "contiguous" (PyTorch's default) or "channels-last". :class:`ModelInputError`
    where the model fails on them or returns no [2, classes] logits (:func:`fed_to_model`)."""
    x = torch.rand((2, *shape), generator=torch.Generator().manual_seed(0))
    arrange = channels_last if layout == "channels-last" else contiguous
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return fed_to_model(model, arrange(x), layout)
    finally:
        model.train(training)


class ModelInputError(AuditInputError):
    """The user's model failed on the images the audit fed it (the message names the model, the input's shape,
    layout and dtype, and what the audit expected)."""


def fed_to_model(model: torch.nn.Module, images: torch.Tensor, layout: str) -> torch.Tensor:
    """``model``'s logits on ``images`` (pixels in [0, 1], normalised here), or one :class:`ModelInputError` line
    where the model raises or returns no [B, classes] logits."""
    fed = f"{list(images.shape)} {str(images.dtype).removeprefix('torch.')} images, {layout} in memory"
    name = f"{type(model).__module__}.{type(model).__qualname__}"
    try:
        out = logits_of(model(normalize(model, images)))
    except Exception as err:  # any failure inside the user's code: one line, not its traceback
        raise ModelInputError(
            f"the model {name} failed on {fed} (the audit's --input, normalised with its --mean/--std), expecting "
            f"logits [{len(images)}, classes]: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from err
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != len(images):
        shown = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelInputError(f"the model {name} returned {shown} for {fed}, not logits [{len(images)}, classes]: "
                              "the audit simulates a classifier trained with cross-entropy over labels")  # fmt: skip
    return out


def logits_of(output: object) -> torch.Tensor:
    """A model's logits: the tensor itself, or a Hugging Face output's ``.logits``."""
    return getattr(output, "logits", output)  # type: ignore[return-value]


def clipped_update(start: dict[str, torch.Tensor], end: dict[str, torch.Tensor], bound: float
                   ) -> dict[str, torch.Tensor]:  # fmt: skip
    """``end`` moved back towards ``start`` so that the update's L2 norm over every array is at most ``bound`` (the
    clipping of Flower's ``fixedclipping_mod``: the update scaled by min(1, C / ‖Δ‖))."""
    norm = math.sqrt(sum(float((end[n].detach() - start[n]).pow(2).sum()) for n in end))
    factor = min(1.0, bound / norm) if norm > 0 else 1.0
    return {n: start[n] + (end[n].detach() - start[n]) * factor for n in end}


def head_weight(bias: str) -> str:
    """The head's weight beside its bias (``fc3.bias`` → ``fc3.weight``)."""
    return bias.removesuffix("bias") + "weight"


# How far a recipe's simulation may sit from the observed update and still be said to fit (:class:`RecipeFit`): the
# update's norm within a factor SCALE_MARGIN either way, the head change's flatness within FLATNESS_MARGIN and, under
# SGD, its cosine down to COSINE_SPREAD times the spread between two simulations of the recipe, less COSINE_FLOOR.
# The simulation trains on auxiliary images, not the client's, so even the right recipe misses by some; the margins
# are set from controls
# (the right recipe against a wrong optimiser, a 10x learning rate, a wrong momentum, a missing augmentation) on
# the CNN and the ViT head: `uv run python -m benchmarks.recipe_fit` (docs/results/data/recipe-fit.csv).
SCALE_MARGIN = 2.0
COSINE_SPREAD, COSINE_FLOOR = 3.0, 0.02
# the lowest cosine bound the fit may use: two simulations of one recipe that agree less than this allows leave the
# direction unresolved, and the fit then says so and fails rather than accept any direction (a bound at or below 0
# would let an update pointing away from the simulation, or at random, fit)
LOWEST_COSINE_BOUND = 0.2
FLATNESS_MARGIN = 0.12
OTHER_DRAW = 7919  # seed offset of the second simulation (another draw of auxiliary images and shuffle)


@dataclasses.dataclass(frozen=True)
class RecipeFit:
    """How well simulating the recipe reproduces the update, at the estimated class counts: the norm of the whole
    trained update (``scale``: simulated / observed; a 10× lr moves the body's layers about 10× as far, while the
    head's change saturates), the head change's direction (``cosine``) and how evenly its entries moved
    (:func:`flatness`: Adam's signature)."""

    recipe: str
    scale: float
    cosine: float
    flatness: tuple[float, float] = (math.nan, math.nan)  # mean |Δ| / RMS Δ, simulated and observed
    own_cosine: float = math.nan  # cosine between two simulations of the recipe on other draws (NaN: not run)

    @property
    def cosine_bound(self) -> float:
        """The lowest cosine that fits: the update may differ from the simulation COSINE_SPREAD times as much as
        two simulations of the recipe differ from each other, and COSINE_FLOOR more (−1 where not checked: the
        direction depends on the estimated counts, which rest on SGD's relation; under Adam they do not hold)."""
        if math.isnan(self.own_cosine):
            return -1.0
        return 1 - COSINE_SPREAD * (1 - self.own_cosine) - COSINE_FLOOR

    @property
    def direction_unresolved(self) -> bool:
        """Two simulations of the recipe differ so much that the cosine bound falls below
        :data:`LOWEST_COSINE_BOUND`: the direction cannot tell a fitting recipe from any other."""
        return not math.isnan(self.own_cosine) and self.cosine_bound < LOWEST_COSINE_BOUND

    def margins(self) -> list[float]:
        """Each measure's distance from the update in units of its margin: norm, direction, flatness (≤ 1: within);
        an unresolved direction is NaN (never within)."""
        return [abs(math.log(max(self.scale, 1e-12))) / math.log(SCALE_MARGIN),
                math.nan if self.direction_unresolved else (1 - self.cosine) / max(1 - self.cosine_bound, 1e-12),
                abs(self.flatness[0] - self.flatness[1]) / FLATNESS_MARGIN]  # fmt: skip

    @property
    def mismatch(self) -> float:
        """How far the simulation is from the update, in margins, a recipe that fits always below one that does not
        (NaN: infinite)."""
        parts = self.margins()
        return math.inf if any(math.isnan(p) for p in parts) else max(parts) + (0 if self.fits else 1e6)

    def brief(self) -> str:
        return (f"{self.recipe}: norm ×{self.scale:.2f}, cosine {self.cosine:.2f}, flatness {self.flatness[0]:.2f}/"
                f"{self.flatness[1]:.2f}{'' if self.fits else ' (does not fit)'}")

    @property
    def fits(self) -> bool:
        return all(part <= 1 for part in self.margins())  # NaN: never

    def described(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        direction = (f"cosine {self.cosine:.3f}, unresolved: two simulations of it agree only to "
                     f"{self.own_cosine:.3f}, a bound below {LOWEST_COSINE_BOUND:g}" if self.direction_unresolved else
                     f"cosine {self.cosine:.3f} (two simulations of it: {self.own_cosine:.3f}; fits from "
                     f"{self.cosine_bound:.3f})" if not math.isnan(self.own_cosine) else
                     f"cosine {self.cosine:.2f} (not checked: it rests on the counts, which rest on SGD's relation)")
        return (f"{self.recipe} {verdict} the update at the estimated class counts: simulated/observed update norm "
                f"×{self.scale:.2f} (fits within ×{SCALE_MARGIN:g} either way), {direction}, flatness "
                f"{self.flatness[0]:.2f}/{self.flatness[1]:.2f} (fits within {FLATNESS_MARGIN:g})")  # fmt: skip


def recipe_fit(simulation: Simulation, rows: np.ndarray, moved: float, name: str, other: Simulation | None = None
               ) -> RecipeFit:  # fmt: skip
    """The fit of one simulation to the observed update: its norm over every trained parameter against ``moved``
    (the update's), its head change against ``rows`` (:func:`head_rows`); ``other``: the same recipe simulated on
    another draw (the direction's spread between two runs of the right recipe)."""
    simulated = simulation.head_delta
    if simulated is None or not np.isfinite(simulated).all() or moved == 0 or not np.isfinite(simulation.update_norm):
        return RecipeFit(name, math.nan, math.nan)
    own = math.nan
    if other is not None and other.head_delta is not None and np.isfinite(other.head_delta).all():
        own = cosine_of(simulated, other.head_delta)
    return RecipeFit(name, simulation.update_norm / moved, cosine_of(simulated, rows),
                     (flatness(simulated), flatness(rows)), own)  # fmt: skip


def cosine_of(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-300)


def flatness(change: np.ndarray) -> float:
    """mean |Δ| / RMS Δ over the entries: near 1 where every entry moved by about as much (Adam's first steps move
    each by about lr per step, whatever its gradient), lower where a few entries carry the change (SGD's steps are
    proportional to the gradient)."""
    rms = float(np.sqrt(np.mean(np.square(change))))
    return float(np.mean(np.abs(change))) / rms if rms > 0 else math.nan
