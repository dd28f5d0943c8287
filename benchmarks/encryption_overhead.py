"""Cost of embedding encryption on a client, next to TenSEAL CKKS on the same data.

fedvit (encrypted-ViT paper): per round a client decrypts the received model (eqs. 13–14) and encrypts its
gradient (eqs. 3, 7). Both are timed (median of --repeats) against one FedSGD step (forward + backward on
one batch, median of --repeats). TenSEAL CKKS (N = 8192, coeff moduli [60, 40, 40, 60], scale 2^40, 4096
slots per ciphertext: the usual FL setting) encrypts the same two layers and then the whole model, one
ciphertext at a time (serialised and discarded, so memory stays flat); time and serialised bytes are
reported, and the ratio to fedvit's.

Usage: uv run --frozen --group bench python benchmarks/encryption_overhead.py [--repeats 5] [--batch 16]
       (--no-ckks runs the fedvit part without TenSEAL)
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from common import TINY, VIT_S16, median_time  # first: puts the checkout on sys.path

from fedvit.clients.encryption import ENCRYPTED, EncryptionKey, model_embedding_dims
from fedvit.clients.training import fedsgd_gradient
from fedvit.core.data import synthetic
from fedvit.core.model import build_model, get_weights

MODELS = {"tiny (default, 32 px)": TINY, "ViT-S/16 224 px": VIT_S16}
SLOTS = 4096  # CKKS slots at N = 8192


def ckks_encrypt(values: np.ndarray) -> tuple[float, int]:
    """Seconds and serialised bytes to CKKS-encrypt ``values`` (float64 slots, 4096 per ciphertext)."""
    import tenseal as ts

    ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=8192, coeff_mod_bit_sizes=[60, 40, 40, 60])
    ctx.global_scale = 2**40
    start, total = time.perf_counter(), 0
    for i in range(0, len(values), SLOTS):
        total += len(ts.ckks_vector(ctx, values[i : i + SLOTS]).serialize())
    return time.perf_counter() - start, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16, help="FedSGD batch of the ViT-S step (tiny: 64)")
    parser.add_argument("--no-ckks", action="store_true", help="skip the TenSEAL comparison")
    args = parser.parse_args()
    if not args.no_ckks:
        try:
            import tenseal  # noqa: F401
        except ImportError:
            sys.exit("TenSEAL is not installed: run with `uv run --frozen --group bench ...` (or pass --no-ckks)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(
        f"command: uv run --frozen --group bench python benchmarks/encryption_overhead.py --repeats {args.repeats}"
        f" --batch {args.batch}{' --no-ckks' if args.no_ckks else ''}   (device: {device}, "
        f"torch threads: {torch.get_num_threads()})"
    )
    for label, cfg in MODELS.items():
        model = build_model(cfg, 10).to(device)
        patch_dim, n1 = model_embedding_dims(model)
        key = EncryptionKey.generate(patch_dim, n1 - 1, seed=0)
        img = int(model.patch_embed.img_size[0])
        batch = 64 if "tiny" in label else args.batch
        images = synthetic(batch * 2, 10, 0, "train")
        idx, rng = np.arange(len(images)), np.random.default_rng(0)
        step_s = median_time(args.repeats, fedsgd_gradient, model, images, idx, batch, img, rng, device)
        grads = fedsgd_gradient(model, images, idx, batch, img, rng, device).arrays
        weights = key.encrypt(get_weights(model))
        dec_s = median_time(args.repeats, key.decrypt, weights)
        enc_s = median_time(args.repeats, key.encrypt, grads)
        layer_values = sum(grads[n].size for n in ENCRYPTED)
        print(
            f"\n{label}: L={patch_dim}, N={n1 - 1}; {layer_values:,} encrypted of "
            f"{sum(g.size for g in grads.values()):,} values; batch {batch}, one FedSGD step {1000 * step_s:.1f} ms"
        )
        crypt_s = dec_s + enc_s
        print(
            f"  fedvit: decrypt model {1000 * dec_s:.2f} ms + encrypt gradient {1000 * enc_s:.2f} ms = "
            f"{1000 * crypt_s:.2f} ms = {100 * crypt_s / step_s:.2f}% of the step; "
            f"payload unchanged ({4 * layer_values / 1e6:.2f} MB for the two layers)"
        )
        if args.no_ckks:
            continue
        two = np.concatenate([grads[n].ravel() for n in ENCRYPTED]).astype(np.float64)
        whole = np.concatenate([g.ravel() for g in grads.values()]).astype(np.float64)
        for what, values in (("the two layers", two), ("the whole model", whole)):
            ckks_s, ckks_bytes = ckks_encrypt(values)
            print(
                f"  CKKS, {what}: encrypt+serialise {ckks_s:.2f} s ({ckks_s / enc_s:,.0f}x fedvit's encryption, "
                f"{100 * ckks_s / step_s:,.0f}% of the step), {ckks_bytes / 1e6:,.1f} MB "
                f"({ckks_bytes / (4 * values.size):.1f}x its float32 size)"
            )


if __name__ == "__main__":
    main()
