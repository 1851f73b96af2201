"""The shared test toolkit: fixtures and helpers every suite uses (loaded as pytest plugins by
tests/conftest.py)."""
