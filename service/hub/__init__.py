"""hub layer."""
