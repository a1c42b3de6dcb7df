"""The plugin system: one hookspec module, one manager, typed component bases."""
