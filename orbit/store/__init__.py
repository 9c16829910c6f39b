"""Store modules of the platform: the only code that runs SQL (queries in ``orbit/sql``)."""
