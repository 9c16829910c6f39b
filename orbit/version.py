"""The version of the orbit-server distribution (``orbit-server --version``).

The only place it is written: ``pyproject.toml`` reads it from here when a wheel is built.
"""

__version__ = "0.1.0"
