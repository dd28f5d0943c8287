"""The batch audit: the optimisation attack's client simulation (FedSGD, FedAvg, masks, PGD), the batch ICA attack
on the patch embedding, batch scoring, FedAvg label recovery, and the leakage-vs-utility frontier."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from fedvit.attacks.holdings import Auxiliary
from fedvit.audit.benchmark import DEFENCES, Setting, client_update_and_labels, defence_config, partitions
from fedvit.core.config import parse_config
from fedvit.observed.observation import Reconstruction, recipe

SMALL_BUDGET = {"audit.iterations": 30, "audit.restarts": 1}


def benchmark_update(tmp_path, defence="plain", setting=None, **overrides):
    setting = setting or Setting(1)
    base = parse_config(SMALL_BUDGET | overrides)
    config = defence_config(base, DEFENCES[defence], 2, tmp_path, setting)
    return client_update_and_labels(config, 0, partitions(config, setting, 2), seed_key=1000)


def simulated_match(obs, images, labels):
    """1 − cos between the attacker's simulation of the client on the TRUE batch and the observed update."""
    from fedvit.attacks.inversion import attack_model, kept_entries, match_loss, observed_target, simulate

    rec = recipe(obs)
    model = attack_model(obs)
    params = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
    logits = torch.full((len(labels), obs.num_classes), -30.0)
    logits[torch.arange(len(labels)), torch.as_tensor(labels)] = 30.0
    correction = None if obs.correction is None else {n: torch.as_tensor(c) for n, c in obs.correction.items()}
    sim = simulate(model, params, torch.as_tensor(images)[None], logits[None], rec, None, correction)
    return float(match_loss(sim, observed_target(obs), kept_entries(obs), 0.0).detach())


def test_the_simulated_client_reproduces_a_fedsgd_batch_update(tmp_path):
    obs, images, labels = benchmark_update(tmp_path, setting=Setting(4))
    assert recipe(obs).batch == 4 and len(images) == 4
    assert simulated_match(obs, images, labels) < 1e-5
    shuffled = np.roll(labels, 1)  # wrong labels: the simulation no longer fits
    assert simulated_match(obs, images, shuffled) > 1e-3


def test_the_simulated_client_unrolls_fedavg_local_steps(tmp_path):
    obs, images, labels = benchmark_update(tmp_path, setting=Setting(2, steps=2))
    rec = recipe(obs)
    assert (rec.sends_gradient, rec.batch, rec.steps, rec.examples) == (False, 2, 2, 4)
    client_order = np.random.default_rng([0, 1, 0]).permutation(4)  # the client's shuffle (training.batch_rng)
    assert simulated_match(obs, images[client_order], labels[client_order]) < 1e-5
    swapped = client_order[[2, 3, 0, 1]]  # the same images, the other step first: a different update
    assert simulated_match(obs, images[swapped], labels[swapped]) > simulated_match(
        obs, images[client_order], labels[client_order]
    )


def test_masked_entries_are_left_out_of_the_match(tmp_path):
    obs, images, labels = benchmark_update(tmp_path, "mask-fresh-r0.5", setting=Setting(2))
    assert simulated_match(obs, images, labels) < 1e-5  # dropped entries (zeros on the wire) are not compared
    unaware = dataclasses.replace(obs, masks=None)
    assert simulated_match(unaware, images, labels) > 0.1  # the zeros would be matched as if they were gradients


def test_pgd_training_changes_the_update_and_the_attacker_re_runs_the_recipe(tmp_path):
    obs, images, labels = benchmark_update(tmp_path, "pgd-at", setting=Setting(4))
    assert recipe(obs).adversarial == 2
    plain_fit = simulated_match(obs, images, labels)  # simulating clean training on the true batch
    assert plain_fit > 1e-4  # the adversarial half changed the update


def test_optimisation_keeps_an_exact_closed_form_start(tmp_path):
    from fedvit.attacks.inversion import invert
    from fedvit.audit.metrics import psnr

    obs, images, _ = benchmark_update(tmp_path)
    rec = invert(obs, parse_config(SMALL_BUDGET).audit)
    assert "closed-form start" in rec.note
    assert psnr(rec.image, images[0]) > 60


def test_optimisation_reconstructs_every_image_of_a_batch_with_progress(tmp_path):
    from fedvit.attacks.inversion import invert

    obs, images, _ = benchmark_update(tmp_path, setting=Setting(4))
    calls = []
    rec = invert(obs, parse_config(SMALL_BUDGET).audit, lambda done, total: calls.append((done, total)))
    assert len(rec.all_images) == 4 and all(img.shape == images[0].shape for img in rec.all_images)
    assert all(0 <= img.min() and img.max() <= 1 for img in rec.all_images)
    assert calls[-1] == (30, 30) and "random start" in rec.note and "labels from the head-bias" in rec.note


def test_fedavg_labels_are_counted_from_the_weight_change(tmp_path):

    from fedvit.attacks.labels import label_accuracy, recover_labels
    from fedvit.audit.user_data import test_split_sample

    obs, _, labels = benchmark_update(tmp_path, setting=Setting(4, steps=2))
    aux = Auxiliary(
        *test_split_sample(parse_config(SMALL_BUDGET), 32), "the test split"
    )  # what the audit simulates with
    counts, reason = recover_labels(obs, aux)
    assert reason.startswith("local training simulated on the test split") and counts.sum() == 8
    assert label_accuracy(counts, labels) >= 0.75


def test_batch_scores_count_unmatched_images_as_the_flat_guess():
    from fedvit.audit.metrics import best_flat_image, psnr, score

    rng = np.random.default_rng(0)
    truths = rng.random((3, 3, 8, 8))
    exact = score(Reconstruction(truths[1]), truths)
    flat = [psnr(best_flat_image(t), t) for t in truths]
    assert exact.matched == "1/3"
    assert exact.per_image_psnr == [flat[0], 200.0, flat[2]]
    assert exact.psnr == pytest.approx(np.mean([flat[0], 200.0, flat[2]]))
    everything = score(Reconstruction(truths[0], images=tuple(truths[::-1])), truths)
    assert everything.matched == "3/3" and everything.psnr == 200.0


def independent_patch_observation(tmp_path, batch: int):
    """An update whose patch-embedding gradient mixes independent (Laplacian) patches: ICA's own assumption."""
    from fedvit.attacks.april import image_to_patches, patches_to_image
    from fedvit.audit.fedvit_run import fedvit_observation
    from fedvit.core.model import build_model, get_weights
    from fedvit.core.params import PATCH_EMBED_WEIGHT, POS_EMBED

    config = parse_config({"model.name": "vit_small_patch16_224", "model.patch-size": 16, "model.embed-dim": 96,
                           "model.num-heads": 2, "batch-size": batch})  # fmt: skip
    model = build_model(config.model, 10, 0)
    weights = get_weights(model)
    rng = np.random.default_rng(0)
    n, d = 4, 96
    obs = fedvit_observation(config, {}, weights, 10, meta={"num-examples": batch})
    truths = [np.clip(0.5 + 0.12 * rng.laplace(size=(3, 32, 32)), 0, 1) for _ in range(batch)]
    patches = np.stack([image_to_patches(t, obs) for t in truths])  # [B, N, L]
    grads = rng.normal(size=(batch, n, d))
    grads -= grads.mean(-1, keepdims=True)  # pre-LN: every token gradient sums to 0
    update = {name: np.zeros_like(w) for name, w in weights.items()}
    update[PATCH_EMBED_WEIGHT] = np.einsum("bnd,bnl->dl", grads, patches).reshape(weights[PATCH_EMBED_WEIGHT].shape)
    update[POS_EMBED][0, 1:] = grads.sum(0)
    truths = [patches_to_image(p, obs) for p in patches]
    return dataclasses.replace(obs, update=update), patches, truths


def test_cocktail_party_unmixes_and_places_independent_patches(tmp_path):
    from fedvit.attacks.cocktail import cocktail_party, unmix_patches
    from fedvit.audit.metrics import psnr

    obs, _, truths = independent_patch_observation(tmp_path, batch=1)
    rec = cocktail_party(obs)
    assert psnr(rec.image, truths[0]) > 30, rec.note
    obs, patches, _ = independent_patch_observation(tmp_path, batch=3)
    found, position, _ = unmix_patches(obs, 3)
    for s in range(4):  # every position holds its own three patches (which image each came from is unknown)
        want, got = patches[:, s], found[position == s]
        corr = np.corrcoef(np.concatenate([got, want]))[:3, 3:]
        assert corr.max(1).min() > 0.95  # each unmixed patch is one of this position's patches, sign and scale right
        scale = np.linalg.norm(got, axis=1) / np.linalg.norm(want[corr.argmax(1)], axis=1)
        assert np.allclose(scale, 1, atol=0.2)  # ICA with 768 samples for 12 sources: estimates, not exact


def test_cocktail_party_states_the_rank_bound(tmp_path):
    from fedvit.attacks.cocktail import batch_bound, cocktail_party

    assert batch_bound(64, 192, 16, pre_ln=True) == 3  # tiny 32 px / patch 8 / D=64: G·1 = 0 costs one
    assert batch_bound(384, 768, 4, pre_ln=True) == 95  # ViT-S/16 at 32 px
    assert batch_bound(384, 768, 196, pre_ln=True) == 1  # ViT-S/16 at 224 px
    obs, _, _ = benchmark_update(tmp_path, setting=Setting(4))
    rec = cocktail_party(obs)
    assert rec.image is None and "B ≤ 3" in rec.note


def test_frontier_rows_pick_the_best_attack_and_the_accuracy_cost(tmp_path):
    from fedvit.audit.frontier import write_frontier

    def reid(attack: str, top1: float) -> dict:  # 4 true images among 100 decoys each, for the image attacks
        if attack.startswith(("labels", "best flat")):
            return {}
        return {"reid-top1": top1, "reid-rank": 1.0, "reid-chance": 0.01, "reid-null": 0.0, "reid-ranks": [1.0] * 4}

    rows = [
        {"defence-name": "plain", "defence": "none", "setting": "B=1, FedSGD", "batch-size": 1, "local-steps": 1,
         "attack": a, "psnr": p, "ssim": 0.5, "seconds": 1.0, "note": "", "label-accuracy": la}
        | reid(a, 1.0 if a == "B" else 0.0)
        for a, p, la in [("labels (head-bias gradient)", None, 1.0), ("A", 30.0, None), ("B", 40.0, None),
                         ("best flat image (reference: no information)", 12.0, None)]
    ] + [
        {"defence-name": "mask-fresh-r0.5", "defence": "mask-fresh-r0.5", "setting": "B=1, FedSGD", "batch-size": 1,
         "local-steps": 1, "attack": a, "psnr": p, "ssim": 0.1, "seconds": 1.0, "note": "n", "label-accuracy": None}
        | reid(a, 0.0)
        for a, p in [("A", 11.0), ("C", None), ("best flat image (reference: no information)", 12.0)]
    ]  # fmt: skip
    written = write_frontier(rows, tmp_path, {"plain": 0.9, "mask-fresh-r0.5": 0.8})
    report = json.loads((tmp_path / "frontier.json").read_text())
    best = {r["defence"]: r for r in report["best"]}
    assert best["plain"]["attack"] == "B" and best["plain"]["psnr"] == 40.0 and best["plain"]["label-accuracy"] == 1
    assert best["plain"]["accuracy-cost"] == 0.0
    assert best["mask-fresh-r0.5"]["accuracy-cost"] == pytest.approx(0.1)
    assert best["mask-fresh-r0.5"]["baseline-psnr"] == 12.0
    assert {r.attack for r in written if r.defence == "mask-fresh-r0.5"} == {"A", "C"}
    assert "| mask-fresh-r0.5 | B=1, FedSGD | — | A | 11.0 |" in (tmp_path / "frontier.md").read_text()  # no budget
    assert (best["plain"]["verdict"], best["mask-fresh-r0.5"]["verdict"]) == ("leaks", "at baseline")
    assert (tmp_path / "frontier.png").stat().st_size > 0


def test_benchmark_cli_rejects_bad_lists(tmp_path, capsys):
    from fedvit.app.cli import main

    assert main(["audit", "--benchmark", "--out", str(tmp_path), "--batch-sizes", "1,x"]) == 2
    assert "--batch-sizes takes comma-separated integers" in capsys.readouterr().err
    assert main(["audit", "--benchmark", "--out", str(tmp_path), "--local-steps", "0"]) == 2
    assert "--local-steps" in capsys.readouterr().err


def test_the_frontier_experiment_trains_every_benchmark_defence_as_the_benchmark_configures_it():
    from pathlib import Path

    from fedvit.app.experiments import load_experiment
    from fedvit.app.run_config import merge_overrides

    root = Path(__file__).resolve().parents[1]
    experiment = load_experiment(root / "conf" / "experiments" / "frontier-cpu.toml")
    assert list(experiment.methods) == list(DEFENCES)
    for name, overrides in experiment.methods.items():
        values = merge_overrides([overrides])
        assert {k: values[k] for k in DEFENCES[name]} == DEFENCES[name], name
        assert set(values) - set(DEFENCES[name]) <= {"centralized-evaluation", "data.client-eval"}, name


def test_collusion_key_decrypts_an_encrypted_batch_update_for_the_optimisation_attack(tmp_path):
    from fedvit.attacks.april import collusion_key, decrypt_observation
    from fedvit.audit.benchmark import _write_colluders
    from fedvit.audit.pipeline import AuditOptions, Reader
    from fedvit.capture.reader import load_exchanges

    base = parse_config(SMALL_BUDGET)
    obs, images, labels = benchmark_update(tmp_path, "encryption-private-init", setting=Setting(4))
    assert simulated_match(obs, images, labels) > 1e-2  # plaintext images do not explain the encrypted update
    folder = _write_colluders(base, "encryption-private-init", 14, tmp_path, tmp_path / "captures")
    colluders = sorted(load_exchanges(folder)[0], key=lambda ex: ex.partition)[1:]  # 13 colluders, 208 patches >= L
    known = [(ex.ground_truth()["images"][0], Reader(AuditOptions()).observe(ex).update) for ex in colluders]
    e_a_t, inverse, _ = collusion_key(dataclasses.replace(obs, known_images=known))
    plain = decrypt_observation(obs, e_a_t, inverse)
    assert plain.defence.encryption == "off" and obs.defence.encryption == "private-init"
    assert simulated_match(plain, images, labels) < 1e-4  # decrypted: the client's plaintext work explains it


def test_frontier_can_be_rewritten_with_accuracies_that_arrived_later(tmp_path, capsys):
    from fedvit.audit.frontier import main

    rows = [
        {"defence-name": d, "defence": d, "setting": "B=1, FedSGD", "attack": "A", "psnr": p, "ssim": 0.1,
         "seconds": 1.0, "note": ""}
        for d, p in (("plain", 50.0), ("pgd-at", 40.0))
    ]  # fmt: skip
    (tmp_path / "audit.json").write_text(json.dumps({"rows": rows}))
    experiment = tmp_path / "exp"
    experiment.mkdir()
    (experiment / "summary.json").write_text(
        json.dumps([{"method": "plain", "final": 0.9}, {"method": "pgd-at", "final": 0.7}])
    )
    assert main([str(tmp_path), "--accuracy-from", str(experiment)]) == 0
    best = {r["defence"]: r for r in json.loads((tmp_path / "frontier.json").read_text())["best"]}
    assert best["pgd-at"]["accuracy-cost"] == pytest.approx(0.2)
    assert "| pgd-at | B=1, FedSGD | — | A | 40.0 |" in capsys.readouterr().out
    assert main([str(tmp_path), "--accuracy-from", str(tmp_path / "missing")]) == 2


def test_benchmark_audits_an_image_folder_of_natural_photographs(tmp_path):
    from benchmarks.natural_images import PHOTOS, write_natural_images
    from fedvit.audit.benchmark import run_benchmark

    folder = write_natural_images(tmp_path / "photos", per_class=3, size=32)
    assert sorted(p.name for p in folder.iterdir()) == sorted(PHOTOS)
    base = parse_config(SMALL_BUDGET | {"data.name": f"imagefolder:{folder}"})
    rows = run_benchmark(base, 2, tmp_path / "audit", ["plain"], [Setting(1), Setting(2)])
    april = [r for r in rows if r["attack"] == "APRIL-E (naive)" and r["setting"] == "B=1, FedSGD"]
    assert len(april) == 2 and all(r["psnr"] > 60 for r in april)
    labels = [r for r in rows if r["attack"] == "labels (head-bias gradient)"]
    assert len(labels) == 4 and all(r["label-accuracy"] is not None for r in labels)
    assert {r["setting"] for r in json.loads((tmp_path / "audit" / "frontier.json").read_text())["rows"]} == {
        "B=1, FedSGD", "B=2, FedSGD"}  # fmt: skip


def test_scaffold_updates_are_simulated_with_the_control_variates_seen_on_the_wire(tmp_path):

    from fedvit.audit.pipeline import AuditOptions, Reader
    from fedvit.capture.reader import load_exchanges
    from tests.helpers import run_in_process

    config = {"out-dir": str(tmp_path), "run-name": "scaffold", "strategy": "scaffold", "num-server-rounds": 2,
              "batch-size": 8, "data.synthetic-train-size": 60, "capture.enabled": True,
              "capture.ground-truth": True}  # fmt: skip
    run_dir, _ = run_in_process(config)
    ex1, ex2 = [ex for ex in load_exchanges(run_dir)[0] if ex.partition == 0]  # rounds 1 and 2, in order
    c_1 = ex1.sent_records["control-delta"]  # c_i after round 1 (from 0)
    reader = Reader(AuditOptions())
    first = reader.observe(ex1)  # the observer sums the client's control-deltas in order
    assert all(np.array_equal(first.correction[n], ex1.received_records["control"][n]) for n in c_1)  # c_i = 0
    obs = reader.observe(ex2)
    c = ex2.received_records["control"]
    assert all(np.array_equal(obs.correction[n], c[n] - c_1[n]) for n in c_1)
    truth = ex2.ground_truth()
    order = np.random.default_rng([0, 2, 0]).permutation(len(truth["labels"]))  # the client's round-2 shuffle
    images, labels = truth["images"][order], truth["labels"][order]
    assert recipe(obs).steps == 2 and obs.correction is not None
    assert simulated_match(obs, images, labels) < 1e-5
    unaware = dataclasses.replace(obs, correction=None)
    assert simulated_match(unaware, images, labels) > 10 * simulated_match(obs, images, labels)


def test_group_consensus_registers_the_restarts_before_averaging():
    from fedvit.attacks.inversion import group_consensus

    a, b = torch.zeros(1, 3, 4, 4), torch.ones(1, 3, 4, 4)
    first = torch.cat([a, b])
    second = torch.cat([b + 0.2, a + 0.2])  # the same two images, other order, shifted
    own_first, own_second = group_consensus([first, second])
    assert torch.allclose(own_first, torch.cat([a + 0.1, b + 0.1]))  # averaged image by image, not slot by slot
    assert torch.allclose(own_second, torch.cat([b + 0.1, a + 0.1]))  # handed back in the restart's own order


def test_priors_and_test_split_starts_run_and_say_so(tmp_path):
    from fedvit.attacks.inversion import attack_model, initial_images, invert, patch_border_variation

    flat_patches = torch.arange(16.0).repeat_interleave(8).view(1, 1, 1, 128)[..., :32].expand(1, 3, 32, 32)
    assert patch_border_variation(torch.full((1, 3, 32, 32), 0.3), 8) == 0
    assert patch_border_variation(flat_patches.contiguous() / 16, 8) > 0  # steps only at the borders
    obs, _, labels = benchmark_update(tmp_path, setting=Setting(4))
    audit = dataclasses.replace(parse_config(SMALL_BUDGET).audit, iterations=4, restarts=2, group_weight=1.0,
                                init="test-split", patch_tv=0.1, prior_schedule="cosine")  # fmt: skip
    rec = invert(obs, audit)
    assert "group consistency 1 over 2 restarts" in rec.note and "test-split start" in rec.note
    assert rec.steps == 8 and len(rec.images) == 4
    wanted = torch.as_tensor(np.sort(labels))
    start, _ = initial_images(obs, attack_model(obs), recipe(obs), 1, audit, wanted)
    test = obs.test_split()
    images, classes = test.batch(np.arange(len(test)), 32)
    for k in range(4):  # each start is a test image of the class asked for
        match = (images - start[k]).abs().flatten(1).amax(1) < 1e-6
        assert match.any() and int(classes[match][0]) == int(wanted[k])


@pytest.mark.parametrize("setting", [Setting(4), Setting(2, steps=2)], ids=["fedsgd", "fedavg-unrolled"])
def test_batched_restarts_simulate_each_restart_exactly_as_alone(tmp_path, setting):
    """Restarts share one vmapped pass, each with its own copy of the weights: restart r's simulated update and
    its gradient in x must be what simulating it alone gives (no mixing through the shared weights)."""
    from fedvit.attacks.inversion import attack_model, match_loss, observed_target, simulate

    obs, _, labels = benchmark_update(tmp_path, setting=setting)
    rec, model = recipe(obs), attack_model(obs)
    params = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
    logits = torch.full((len(labels), obs.num_classes), -30.0)
    logits[torch.arange(len(labels)), torch.as_tensor(labels)] = 30.0
    x = torch.rand(3, len(labels), 3, 32, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    target = observed_target(obs)

    def run(candidates):
        sim = simulate(model, params, candidates, logits.expand(len(candidates), -1, -1), rec, None)
        match = match_loss(sim, target, None, 1.0)
        return sim, match, torch.autograd.grad(match.sum(), candidates)[0]

    batched_sim, batched, batched_grad = run(x)
    for r in range(3):
        alone_sim, alone, alone_grad = run(x[r : r + 1].detach().clone().requires_grad_(True))
        for name, update in alone_sim.items():
            assert torch.allclose(batched_sim[name][r], update[0], rtol=1e-4, atol=1e-7), name
        assert torch.allclose(batched[r], alone[0], rtol=1e-4, atol=1e-6)
        assert torch.allclose(batched_grad[r], alone_grad[0], rtol=1e-3, atol=1e-7)
    assert not torch.allclose(batched[0], batched[1])  # different candidates, different matches


def test_the_cosine_prior_schedule_fades_the_priors_out():
    from fedvit.attacks.inversion import prior_weight

    assert [prior_weight("cosine", t, 8) for t in (0, 4, 8)] == pytest.approx([1.0, 0.5, 0.0])
    assert prior_weight("constant", 8, 8) == 1.0


def test_the_gaussian_start_is_standard_normal_on_the_models_normalised_scale():
    """``audit.init = "gaussian"`` (breaching's start): N(0, 1) after the model's normalisation, clamped to the
    pixel box, so each channel saturates at 0 and 1 as often as N(0, 1) falls beyond its box (two quantiles per
    channel: they pin both its mean and its std)."""
    from fedvit.attacks.inversion import noise_start

    model = torch.nn.Identity()
    model.pretrained_cfg = {"mean": (0.4, 0.5, 0.6), "std": (0.2, 0.5, 0.3)}
    x = noise_start("gaussian", (4000, 3, 4, 4), model, torch.Generator().manual_seed(0))
    normal = torch.distributions.Normal(0.0, 1.0)
    for c, (m, s) in enumerate(zip(model.pretrained_cfg["mean"], model.pretrained_cfg["std"], strict=True)):
        low, high = float(normal.cdf(torch.tensor(-m / s))), 1 - float(normal.cdf(torch.tensor((1 - m) / s)))
        assert abs(float((x[:, c] == 0).float().mean()) - low) < 0.005
        assert abs(float((x[:, c] == 1).float().mean()) - high) < 0.005
    uniform = noise_start("noise", (4000, 3, 4, 4), model, torch.Generator().manual_seed(0))
    assert 0 <= float(uniform.min()) and float(uniform.max()) < 1 and abs(float(uniform.mean()) - 0.5) < 0.01
