"""Whole jobs: the stages strung together for one dataset (``dataset``) or a mixture (``mixture``)."""
