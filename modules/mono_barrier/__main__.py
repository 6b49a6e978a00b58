"""``python -m modules.mono_barrier slope [--sweep scaling]``: the log-log slope of queries against n."""

import sys

from modules.mono_barrier.analysis import main

sys.exit(main(sys.argv[1:]))
