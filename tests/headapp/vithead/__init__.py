"""vithead: Flower's ViT fine-tuning example in miniature (written for fedvit's tests)."""
