"""sortpack benchmark suite: ``python -m benchmarks --scale small|full [--ranks 1,2] [--only NAME]``.

Every figure is printed next to a baseline measured in the same run, so ratios stay
meaningful on any machine. See ``benchmarks/README.md``.
"""
