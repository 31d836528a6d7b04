"""The version, in one place (setup.cfg reads it from here)."""
__version__ = "0.1.0"
