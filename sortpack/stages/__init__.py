"""The stages on numpy arrays: analyze, sort, pack (and the samples moved between them)."""
