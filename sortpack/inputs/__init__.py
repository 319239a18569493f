"""Inputs: discovery of input files, one reader per format, size and difficulty SPECs."""
