"""``ripieno benchmark``: models against each other on many tables (``command``), resumable and shared."""
