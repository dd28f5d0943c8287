"""The clients' side of the federation: what a client computes for one message (local training, masks, encryption,
PGD) on plain arrays. Builds on core only; never imports the server's strategies or the attacker."""
