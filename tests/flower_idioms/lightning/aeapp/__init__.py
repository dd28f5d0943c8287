"""aeapp: a LightningModule autoencoder, as Flower's quickstart-pytorch-lightning federates one."""
