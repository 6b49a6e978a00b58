"""MLflow plumbing: the logger, the run registry, the config artifact, figures and tables, system metrics,
the tracking URI. The floor above ``errors.py``: imports no other floor of the project."""
