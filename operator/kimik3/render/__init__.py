"""Builders of the child objects of a KimiK3Deployment, as plain dicts (no YAML templating)."""
