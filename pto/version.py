"""The version of pto (one definition: the package, generated files and tools read it here)."""

__version__ = "0.1.0"
