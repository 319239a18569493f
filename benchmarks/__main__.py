"""Entry point: ``python -m benchmarks``."""
import sys

from .suite import main

sys.exit(main())
