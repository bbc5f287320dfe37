"""`python -m cli.bench` == `llamba-bench`."""

import sys

from cli.bench import main

sys.exit(main())
