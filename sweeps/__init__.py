"""Sweeps over experiment configs and side-by-side comparison of their runs in MLflow.

``python main.py sweep --config configs/<method>/<sweep>.yaml`` runs every point of a grid (x seeds) as its
own ``fit`` (and ``test``), each a child MLflow run of one parent run; ``python main.py compare`` answers the
comparison without a browser. The sweep file format is documented in ``docs/sweeps.md``.
"""

from sweeps.spec import Point, SweepSpec, expand, load_sweep

__all__ = ["Point", "SweepSpec", "expand", "load_sweep"]
