"""``python -m modules.spike_tokenizers dissociation|heldout [--sweep benchmark]``: analyses over the benchmark's
runs, each logged as a run (``analysis.py``)."""

import sys

from modules.spike_tokenizers.analysis import main

sys.exit(main(sys.argv[1:]))
