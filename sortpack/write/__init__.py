"""The write side: output directories, metrics/sorted/index writers, provenance, the store."""
