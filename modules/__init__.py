"""One LightningModule per method; shared building blocks live in ``modules.components``."""
