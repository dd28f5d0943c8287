"""qsapp: written in the idioms of Flower's quickstart-pytorch (Message API, aliased train/test imports)."""
