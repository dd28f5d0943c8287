"""aeapp: a LightningModule autoencoder, as Flower's quickstart-pytorch-lightning federates one (read, not run:
Lightning is not among fedvit's test dependencies)."""
