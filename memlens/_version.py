"""The package version, in a module of its own so that `memlens.cli` can print it without importing the
package's public face (`memlens/__init__.py`), which sits above the command line."""
__version__ = "0.1.0"  # keep equal to pyproject.toml's version
