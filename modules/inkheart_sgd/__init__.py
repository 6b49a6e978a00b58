"""Bidirectionally compressed distributed SGD in the h/kappa time model (paper 004-18, Inkheart SGD and M4).

"Scalable Distributed Stochastic Optimization via Bidirectional Compression: Beyond Pessimistic Limits"
(arXiv 2605.07795). Only the abstract is known. Problem: min f(x) = (1/n) sum_i f_i(x) with n workers and a
server; f L-smooth, stochastic gradients unbiased with variance <= sigma^2, Delta = f(x^0) - f*. Time model:
a worker needs h seconds per stochastic gradient, sending one coordinate over a link takes kappa seconds, the
n worker-server links work in parallel, and the two directions are counted apart (a broadcast of x costs
kappa d, a different d/n-coordinate message to every worker kappa d/n). The known lower bound,
Omega~(min{kappa d L Delta/eps + h L Delta/eps + h sigma^2 L Delta/(n eps^2), h sigma^2 L Delta/eps^2 +
h L Delta/eps}), is matched by single-node SGD or Synchronous SGD: the d-term and the sigma^2-term cannot both
fall with n. The paper's methods break this under an extra structural assumption (read here as the
functional (L_A, L_B) inequality of MARINA-P; see ``datamodules.dist_problems``).

Simulated methods (``method``; one Lightning training step = one server round; real gradients, simulated
seconds), every round costs (compute) + kappa (up-coordinates per link, if ``uplink_cost``) + kappa
(down-coordinates per link):

- ``sgd``: one node holding f, x+ = x - gamma g(x) with g the stochastic gradient of a uniformly random
  f_i; h per step, nothing sent.
- ``sync_sgd``: broadcast x (kappa d), every worker one stochastic gradient (h), sent uncompressed (kappa d).
- ``rennala``: Rennala SGD (Tyurin & Richtarik 2023) with batch B; a worker's cycle is receive x (kappa d),
  compute (h_i), send (kappa d, if counted): ``modules.components.worker_sim.RennalaServer`` on that cycle.
- ``randk_sync``: Sync SGD whose uplink is Rand-K (k coordinates, independent per worker, unbiased); full
  broadcast down.
- ``marina_p`` (Gruntkowska, Tyurin & Richtarik 2024): x+ = x - gamma g; with probability p the server
  broadcasts x+ (w_i = x+, kappa d), else worker i adds its part Q_i(x+ - x) of a Perm-K (or independent
  Rand-K) compression (w_i += Q_i(x+ - x), kappa max_i |block_i| per link); g = (1/n) sum_i g_i(w_i), the
  stochastic gradients at the workers' own points, sent uncompressed. Perm-K keeps mean_i w_i = x.
- ``m4_inferred`` (a RECONSTRUCTION, not the paper's algorithm): MARINA-P's Perm-K downlink; the uplink
  sends, MARINA-style, only the change of each worker's momentum estimate z_i <- (1 - beta) z_i + beta
  g_i(w_i) (M3's momentum, Gruntkowska, Tyurin & Richtarik 2024) restricted to the worker's own block of the
  last downlink permutation, unscaled (after a broadcast round z_i is sent whole); the server keeps
  g = mean_i z_i. The m fastest workers take part, m minimising (h_(m) + kappa E[up + down]) (1 + sigma^2 /
  (m eps)) (ties to the largest m).
- ``inkheart_inferred`` (a RECONSTRUCTION): the same round; in a round of compute time t worker i averages
  b_i = floor(t / h_i) stochastic gradients at w_i (z_i = that mean, no momentum); t fixed once by a
  Shadowheart-style equilibrium rule (Tyurin, Pozzi, Ilin & Richtarik 2024): the t in {j h_i} minimising
  (t + kappa E[up + down]) (1 + sigma^2 / (B(t) eps)), B(t) = sum_i b_i(t).

For a separable (diagonal) homogeneous quadratic with exact gradients and beta = 1, grad f(w_i) changes only
on worker i's downlink block, so the block uplink is exact and both reconstructions are gradient descent in
iterates (tested); with beta < 1 or noise the dropped off-block changes are an error that a broadcast resets.

``CompressedDDPClassifier`` is the real path's task: a classifier trained under
``modules.components.ddp_hooks.CompressedDDPStrategy`` (compressed gradient buckets all-reduced on
``torch.distributed``; the downlink stays simulated).

The room: ``servers.py`` (the h/kappa clock ``CommServer``, ``worker_times``, single-node SGD, Sync SGD,
``RennalaCycle``), ``marina.py`` (MARINA-P's downlink, ``MarinaPServer``, the reconstructions ``M4Server`` and
``InkheartServer``), ``build.py`` (``build_server``, ``METHODS``), ``task.py`` (``CompressedDistributedSGD``),
``classifier.py`` (``CompressedDDPClassifier``).
"""


from modules.inkheart_sgd.build import METHODS, Method, build_server
from modules.inkheart_sgd.classifier import CompressedDDPClassifier
from modules.inkheart_sgd.marina import InkheartServer, M4Server, MarinaPServer
from modules.inkheart_sgd.servers import CommServer, RennalaCycle, SGDServer, SyncServer, worker_times
from modules.inkheart_sgd.task import CompressedDistributedSGD

__all__ = [
    "METHODS",
    "CommServer",
    "CompressedDDPClassifier",
    "CompressedDistributedSGD",
    "InkheartServer",
    "M4Server",
    "MarinaPServer",
    "Method",
    "RennalaCycle",
    "SGDServer",
    "SyncServer",
    "build_server",
    "worker_times",
]
