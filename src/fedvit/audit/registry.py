"""Every attack the audit knows, in the order it runs them, each with one check: does it apply to this observation
(its model, its recipe, the defence its run config names), and if not, why. Label recovery gives class counts;
the others give images."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedvit.attacks import april
from fedvit.attacks.cocktail import cocktail_party
from fedvit.attacks.inversion import collusion_inversion, fedavg_aware_invert, invert
from fedvit.attacks.observation import Observation, Reconstruction, as_gradient, has_vit_embeddings, recipe, simulated
from fedvit.core.params import QKV0_WEIGHT

LABELS = "labels (head-bias gradient)"
OPTIMISATION = "gradient matching (optimisation, defence-aware)"
FEDAVG_AWARE = "FedAvg-aware gradient matching (per-epoch image sets)"
COLLUSION_OPTIMISATION = "collusion key, then gradient matching"
BATCH_ICA = "patch-embedding ICA (batch)"


@dataclass(frozen=True)
class Attack:
    """One attack: its report name, why it does not apply to an observation (None: it does), and how it runs."""

    name: str
    why_not: Callable[[Observation], str | None]
    run: Callable[..., Reconstruction]
    optimising: bool = False  # takes (obs, budget, progress, device); its strength is a number of Adam steps


def _defence(obs: Observation, what: str) -> str | None:
    """Why a defence-aware attack does not apply: another app's capture, or a run without ``what``."""
    if obs.config is None:
        return "this capture is another app's: its run config names no fedvit defence"
    mask_mode = obs.config.mask.mode if obs.masks is not None else None
    present = {
        "masks": mask_mode not in (None, "fixed-position"),
        "fixed-position": mask_mode == "fixed-position",
        "encryption": obs.config.encryption.enabled,
        "colluders": obs.config.encryption.enabled and bool(obs.known_images),
    }[what]
    return None if present else f"no {what} in this run"


def _attention(obs: Observation) -> str | None:
    if (why := has_vit_embeddings(obs)) is not None:
        return why
    return None if QKV0_WEIGHT in obs.update else "no blocks.0.attn.qkv.weight in the update"


def _batch(obs: Observation) -> str | None:
    if (why := has_vit_embeddings(obs)) is not None:
        return why
    client = recipe(obs)
    return None if client.sends_gradient and client.batch > 1 else "needs one gradient of two or more images"


MAX_IMAGES = 64  # published image recovery from FedAvg updates: ≲ 50 images per client (Dimitrov et al., TMLR 2022)


def optimisable(obs: Observation) -> str | None:
    """Why the optimisation attack is not attempted: a recipe it cannot simulate, or more images than any published
    inversion recovers from one update (it would spend its budget on a few steps and report noise)."""
    if (why := simulated(obs)) is not None:
        return why
    client = recipe(obs)
    if client.examples > MAX_IMAGES:
        return (
            f"not attempted: {client.examples} images over {client.steps} local step(s) in this update, beyond the "
            f"≤ {MAX_IMAGES} images per update that image inversion is known to recover (Dimitrov et al., \"Data "
            "Leakage in Federated Averaging\", TMLR 2022); the labels are what such an update gives away"
        )
    return None


def several_epochs(obs: Observation) -> str | None:
    """Why the FedAvg-aware attack does not apply: what the optimisation attack refuses, or fewer than two epochs."""
    if (why := optimisable(obs)) is not None:
        return why
    client = recipe(obs)
    if client.sends_gradient or client.epochs < 2:
        return "needs several local epochs over the same images (its image sets are per epoch)"
    return None


def labels_apply(obs: Observation) -> str | None:
    """Why label recovery cannot run (None when it can; it may still find the bias hidden)."""
    return simulated(obs)


def naive_embedding_route(obs: Observation) -> Reconstruction:
    """APRIL-E on the update read as a gradient (a FedAvg update's weight change is lr times a summed gradient)."""
    return april.embedding_route(as_gradient(obs))


def naive_attention_route(obs: Observation) -> Reconstruction:
    """APRIL's attention closed form on the update read as a gradient."""
    return april.attention_route(as_gradient(obs))


IMAGE_ATTACKS: tuple[Attack, ...] = (
    Attack("APRIL-E (naive)", has_vit_embeddings, naive_embedding_route),
    Attack("APRIL attention (naive)", _attention, naive_attention_route),
    Attack(BATCH_ICA, _batch, cocktail_party),
    Attack("fixed-position-aware", lambda obs: _defence(obs, "fixed-position"), april.fixed_position),
    Attack("APRIL-E mask-aware", lambda obs: _defence(obs, "masks"), april.masked_embedding_route),
    Attack("known-plaintext", lambda obs: _defence(obs, "encryption"), april.known_plaintext_route),
    Attack("known images (collusion)", lambda obs: _defence(obs, "colluders"), april.known_images_route),
    Attack(COLLUSION_OPTIMISATION, lambda obs: _defence(obs, "colluders") or optimisable(obs), collusion_inversion,
           optimising=True),  # fmt: skip
    Attack(OPTIMISATION, optimisable, invert, optimising=True),
    Attack(FEDAVG_AWARE, several_epochs, fedavg_aware_invert, optimising=True),
)


def applicable(obs: Observation) -> tuple[list[Attack], dict[str, str]]:
    """The image attacks that apply to ``obs``, and for each that does not, why."""
    chosen, refused = [], {}
    for attack in IMAGE_ATTACKS:
        why = attack.why_not(obs)
        if why is None:
            chosen.append(attack)
        else:
            refused[attack.name] = why
    return chosen, refused


