"""In-job data preparation (imports the training stack lazily)."""
