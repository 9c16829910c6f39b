"""Weave's store modules: the only code that runs SQL on weave_* tables."""
