"""Service fixtures (one per service: env URL, else container, else local process)."""

import os
import sys

# Spark workers must run this interpreter (pyarrow and the project are installed here).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from tests.fixtures.services import *  # noqa: F403
