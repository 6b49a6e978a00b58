"""Model-agnostic diagnostics and the MLflow plumbing (config artifact, figures, system metrics)."""
