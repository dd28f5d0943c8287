"""The audit: captured exchanges read as observations, every registered attack and leakage measure that applies,
its figures against a null that holds no information, one report."""
