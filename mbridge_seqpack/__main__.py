"""``python -m mbridge_seqpack`` runs the CLI."""

import sys

from mbridge_seqpack.cli import main

sys.exit(main())
