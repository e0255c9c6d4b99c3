"""Small helpers shared across the package (no model math here)."""
