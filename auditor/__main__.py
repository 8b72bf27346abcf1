"""`python -m auditor ...`, same as the `auditor` command."""
import sys

from auditor.cli import main

sys.exit(main())
