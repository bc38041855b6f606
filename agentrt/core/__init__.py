"""The bottom layer: token-exact data types, the config base, registries, errors, seeding, plugins."""
