"""legacyapp: the legacy client API (``client_fn`` and a ``NumPyClient``), as Flower's step-by-step simulation
tutorial and fl-dp-sa write it."""
