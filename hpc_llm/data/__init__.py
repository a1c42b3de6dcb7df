"""Data: dataloader sections (pure) and in-job preparation of bundled data."""
