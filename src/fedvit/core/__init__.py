"""The ground: the shared vocabulary every other package stands on — run config, parameter names and roles,
the timm model factory, datasets and partitions, mask encoding, result files. It imports no other fedvit package."""
