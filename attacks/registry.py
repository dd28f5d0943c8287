"""Every attack the audit knows, each with one check: does it apply to this observation (its model, its recipe,
the defence its run config names), and if not, why.

The audit runs them in this order on every captured exchange. Label recovery gives class counts; the others give
images. The optimisation attacks take a budget (Adam steps) and a device; the closed forms take only the
observation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attacks import april
from attacks.cocktail import cocktail_party
from attacks.inversion import collusion_inversion, invert
from attacks.observation import Observation, Reconstruction, as_gradient, has_vit_embeddings, recipe, simulated
from core.params import QKV0_WEIGHT

LABELS = "labels (head-bias gradient)"
OPTIMISATION = "gradient matching (optimisation, defence-aware)"
COLLUSION_OPTIMISATION = "collusion key, then gradient matching"
BATCH_ICA = "patch-embedding ICA (batch)"


@dataclass(frozen=True)
class Attack:
    """One attack: its report name, why it does not apply to an observation (None: it does), and how it runs."""

    name: str
    why_not: Callable[[Observation], str | None]
    run: Callable[..., Reconstruction]
    optimising: bool = False  # takes (obs, budget, progress, device); its strength is a number of Adam steps


def _fedvit_defence(obs: Observation, what: str) -> str | None:
    return None if obs.config is not None else f"{what} is a fedvit defence; this capture is another app's"


def _masked(obs: Observation) -> str | None:
    if obs.masks is None:
        return "the payload carries no masks"
    return _fedvit_defence(obs, "masking")


def _fixed_position(obs: Observation) -> str | None:
    if (why := _masked(obs)) is not None:
        return why
    return None if obs.config.mask.mode == "fixed-position" else f"the masks are {obs.config.mask.mode!r}"


def _mask_aware(obs: Observation) -> str | None:
    if (why := _masked(obs)) is not None:
        return why
    return "the fixed-position method masks no patch embedding" if obs.config.mask.mode == "fixed-position" else None


def _encrypted(obs: Observation) -> str | None:
    if (why := _fedvit_defence(obs, "encryption")) is not None:
        return why
    return None if obs.config.encryption.enabled else "the run does not encrypt"


def _colluders(obs: Observation) -> str | None:
    if (why := _encrypted(obs)) is not None:
        return why
    return None if obs.known_images else "no colluding clients' images are known"


def _attention(obs: Observation) -> str | None:
    if (why := has_vit_embeddings(obs)) is not None:
        return why
    return None if QKV0_WEIGHT in obs.update else "no blocks.0.attn.qkv.weight in the update"


def _batch(obs: Observation) -> str | None:
    if (why := has_vit_embeddings(obs)) is not None:
        return why
    client = recipe(obs)
    if not client.sends_gradient or client.batch < 2:
        return "needs one gradient of a batch of two or more images"
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
    Attack("fixed-position-aware", _fixed_position, april.fixed_position),
    Attack("APRIL-E mask-aware", _mask_aware, april.masked_embedding_route),
    Attack("known-plaintext", _encrypted, april.known_plaintext_route),
    Attack("known images (collusion)", _colluders, april.known_images_route),
    Attack(COLLUSION_OPTIMISATION, _colluders, collusion_inversion, optimising=True),
    Attack(OPTIMISATION, simulated, invert, optimising=True),
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


