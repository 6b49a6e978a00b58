"""Compression-level error prediction (paper 000-13): bound a fit's error without the ground truth, from the
difference between fits at two compression levels.

Setting. A family of signal parameterisations indexed by a compression level k (grid resolution, number of
Fourier features, hash-table size, tensor rank; ``signal_fits``), f_k the fit at level
k (to the samples, or a reconstruction from measurements y = A f* in an inverse problem), f* the unknown
signal. Contraction (our reading of the paper's "natural properties"): ||f_{k+1} - f*|| <= rho ||f_k - f*||
with rho < 1. With d_k = ||f_k - f_{k+1}|| (RMS over pixels) the triangle inequality gives

    ||f_k - f*|| <= d_k + ||f_{k+1} - f*|| <= d_k + rho ||f_k - f*||   =>   ||f_k - f*|| <= d_k / (1 - rho),

and when the fits are least squares over nested subspaces (grids r = 2^j + 1, linear Fourier features,
single-channel CP = truncated SVD) f_k - f_{k+1} is orthogonal to f_{k+1} - f*, so
||f_k - f*||^2 = d_k^2 + ||f_{k+1} - f*||^2 <= d_k^2 + rho^2 ||f_k - f*||^2 and
||f_k - f*|| <= d_k / sqrt(1 - rho^2) (equality when the contraction is exactly rho).

Predictors (``predict_errors``): the worst-case bound with rho calibrated on held-out signals (the largest
ratio ||f_{k+1} - f*|| / ||f_k - f*|| seen there), the signal-specific prediction with rho estimated from
the signal's own ladder (the median of d_{k+1} / d_k), and local error maps |f_k - f_{k+1}| times the same
factor.

The room, one concern per file:

- ``functional``: ``contraction_factor``, ``predict_errors``, ``ContractionError``, the scores ``spearman``,
  ``gaussian_blur``, ``rms``;
- ``fitting``: ``fit_level`` (one signal, one level; direct least squares where it exists) and
  ``train_field`` (full-batch Adam);
- ``signal_fits``: the four families (grid, Fourier features, hash grid, CP) and their direct solves;
- ``measurements``: the measurement operators (``DirectObservation``, the MRI analog ``MaskedFourier``, the
  CT analog ``ParallelBeam``); ``sparse``: the constant sparse products both CT and hash grids use;
- ``analysis``: ``score_ladder``, the bound and predictions scored against the truth;
- ``tasks``: ``SignalFit`` (one level) and ``CompressionLadder`` (all levels in one ``fit``, one level per
  epoch, each warm-started from the previous one; the test step scores the bound and the predictions).

Configs name the tasks by their real path (``modules.compression_error.tasks.CompressionLadder``); this
package re-exports the public API, so ``from modules.compression_error import predict_errors`` works.
"""

from modules.compression_error.analysis import SUMMARY_KEYS, score_ladder
from modules.compression_error.fitting import fit_level, train_field
from modules.compression_error.functional import (
    ContractionError,
    contraction_factor,
    gaussian_blur,
    predict_errors,
    rms,
    spearman,
)
from modules.compression_error.measurements import Task
from modules.compression_error.signal_fits import FAMILIES, Family
from modules.compression_error.tasks import DEFAULT_LEVELS, CompressionLadder, SignalFit

__all__ = [
    "DEFAULT_LEVELS",
    "FAMILIES",
    "SUMMARY_KEYS",
    "CompressionLadder",
    "ContractionError",
    "Family",
    "SignalFit",
    "Task",
    "contraction_factor",
    "fit_level",
    "gaussian_blur",
    "predict_errors",
    "rms",
    "score_ladder",
    "spearman",
    "train_field",
]
