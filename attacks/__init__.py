"""The attacker, above both sides of the federation: the eavesdropper's captures, gradient-inversion attacks
that take only what was captured (ground truth reaches only the metrics), image metrics and the audit."""
