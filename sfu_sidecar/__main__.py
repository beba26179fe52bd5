from __future__ import annotations

import sys

from sfu_sidecar.cli import main

sys.exit(main())
