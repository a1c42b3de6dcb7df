"""Config: typed schemas, ConfigStore registration, login-side validation."""
