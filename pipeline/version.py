"""The version of tracepipe (one place: the package, the tables and the manifest record it)."""

__version__ = "0.1.0"
