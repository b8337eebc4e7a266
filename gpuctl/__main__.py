"""``python -m gpuctl``: the same as the ``gpuctl`` command."""

import sys

from gpuctl.cli import main

sys.exit(main())
