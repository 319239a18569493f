"""Reports on a directory: ``sortpack inspect`` and its figure."""
