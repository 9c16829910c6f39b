"""Pulse store modules: the only Pulse code that runs SQL (queries in ``pulse/sql``)."""
