"""ScaleBITS (paper 004-09): block-wise mixed-precision bit allocation with dynamic sensitivity and reordering.

Post-training, weight-only quantisation of a ``TinyGPT``: every ``blocks.*`` linear weight is cut into
``tile x tile`` blocks b, each quantised by group-wise RTN (``modules.components.fake_quant.quantize_rtn``)
at its own bit width q_b in ``bits``, under the budget sum_b |b| q_b <= budget_bits * sum_b |b|.

``ScaleBITSFP`` trains the full-precision model (``fp.yaml``). ``ScaleBITSQuantizer`` quantises it (from
``fp_ckpt``, or after ``fp_steps`` of training in the same fit) without touching a weight:

1. the first ``calib_batches`` training batches are kept as the calibration set;
2. ``reorder`` permutes the hidden dimension of every foldable chain (``mlp.fc`` -> ``mlp.proj``, and per
   head the value rows of ``attn.qkv`` -> the columns of ``attn.proj``) by element sensitivity
   s = F (Q_min(W) - W)^2 at the FP model (``rows``: the producer's row sums, ``cols``: the consumer's column
   sums, ``both``: their sum), so that sensitive channels fill whole tiles; the function is unchanged;
3. ``allocation=greedy``: every block starts at max(bits); each training step is one greedy round
   (``allocate_bits``): the marginal cost of lowering block b one step, from q to q', is

       Delta_b = g_b . delta_b + 1/2 sum F_b delta_b^2,    delta_b = Q_q'(W_b) - Q_q(W_b),

   with g and the Fisher diagonal F the mean gradient and mean squared gradient of the calibration loss over
   the calibration batches, taken at the current quantised model (``sensitivity=dynamic``) or once at the FP
   model (``static``); the round lowers the ``round_frac`` share of blocks with the lowest Delta_b per saved
   bit. ``uniform``: every block at ``budget_bits``; ``random``: a random mix of the two bit widths around the
   budget that meets it. The fit stops when the budget is met.

Evaluation logs ``<stage>/bpb`` (the quantised model), ``bpb_fp``, ``bpb_increase`` (their difference, per
batch), ``avg_bits`` and ``sensitivity_gini`` (the Gini coefficient of the blocks' summed sensitivities s
after reordering, the concentration that reordering is meant to raise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.func import functional_call

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.fake_quant import quantize_rtn
from modules.components.lm_task import CausalLMTask, load_lm
from modules.components.supervised import NetFactory
from modules.components.tiny_gpt import TinyGPT

Sensitivity = Literal["dynamic", "static"]
Allocation = Literal["greedy", "uniform", "random"]
Reorder = Literal["none", "rows", "cols", "both"]


def fp_net(shape: tuple[int, ...], vocab: int) -> TinyGPT:
    """The paper's toy FP model: 4 layers, 4 heads, width 128, RMSNorm (about 0.8M parameters)."""
    return TinyGPT(shape, vocab, n_layer=4, n_head=4, n_embd=128, norm="rmsnorm")


# --- the allocation -----------------------------------------------------------------------------------------
def check_bits(bits: Sequence[int], budget_bits: float) -> None:
    """Bits strictly increasing and positive; the budget inside [min(bits), max(bits)]."""
    if not bits or any(b <= 0 for b in bits) or any(a >= b for a, b in zip(bits, bits[1:])):
        raise ConfigError(f"bits must be positive and sorted ascending without repeats (e.g. [2, 3, 4]), got {list(bits)}")
    if not bits[0] <= budget_bits <= bits[-1]:
        raise ConfigError(f"budget_bits={budget_bits} is outside [min(bits), max(bits)] = [{bits[0]}, {bits[-1]}]")


def lower_bits(alloc: Tensor, bits: Sequence[int]) -> Tensor:
    """The next bit width below each block's (its own at min(bits))."""
    table = torch.as_tensor(list(bits), device=alloc.device)
    idx = torch.searchsorted(table, alloc)
    return table[(idx - 1).clamp_min(0)]


def greedy_round(
    alloc: Tensor, cost: Tensor, block_sizes: Tensor, bits: Sequence[int], budget_bits: float, k: int
) -> tuple[Tensor, bool]:
    """One round of ``allocate_bits``: ``(new allocation, budget met)``; ``alloc`` is not modified."""
    alloc = alloc.clone()
    sizes = block_sizes.to(torch.float64)
    budget = budget_bits * float(sizes.sum())
    used = float((sizes * alloc).sum())
    if used <= budget:
        return alloc, True
    lower = lower_bits(alloc, bits)
    saved = (alloc - lower).to(torch.float64)
    eligible = saved > 0
    priority = torch.where(eligible, cost.detach().to(torch.float64).cpu() / (sizes * saved.clamp_min(1)), math.inf)
    order = torch.argsort(priority, stable=True)
    for j in order[:k].tolist():
        if not bool(eligible[j]):
            break
        alloc[j] = lower[j]
        used -= float(sizes[j] * saved[j])
        if used <= budget:
            return alloc, True
    return alloc, False


def allocate_bits(
    marginal_cost: Callable[[Tensor], Tensor],
    block_sizes: Tensor,
    bits: Sequence[int] = (2, 3, 4),
    budget_bits: float = 2.5,
    round_frac: float = 0.05,
) -> Tensor:
    """Greedy rounds from max(bits) until sum size * bits <= budget_bits * sum size: each round asks
    ``marginal_cost(alloc)`` (the loss increase of lowering each block one step in ``bits``), ranks the blocks
    above min(bits) by cost / (size x bits saved) and lowers the ``max(1, floor(round_frac n))`` cheapest in
    that order, stopping the moment the budget holds. Returns the bit widths, ``LongTensor (n,)``."""
    bits = list(bits)
    check_bits(bits, budget_bits)
    if not 0 < round_frac <= 1:
        raise ConfigError(f"round_frac must be in (0, 1], got {round_frac}")
    n = block_sizes.numel()
    k = max(1, math.floor(round_frac * n))
    alloc = torch.full((n,), bits[-1], dtype=torch.long)
    done = False
    while not done:
        cost = marginal_cost(alloc.clone())
        if cost.shape != (n,):
            raise ConfigError(f"marginal_cost must return one cost per block, shape ({n},), got {tuple(cost.shape)}")
        alloc, done = greedy_round(alloc, cost, block_sizes, bits, budget_bits, k)
    return alloc


def random_allocation(n: int, bits: Sequence[int], budget_bits: float, generator: torch.Generator) -> Tensor:
    """Blocks in random order lowered from the bit width just above the budget to the one just below, until the
    budget holds (a random 2/3 mix at 2.5 bits); every block at ``budget_bits`` when it is one of ``bits``."""
    hi = min(b for b in bits if b >= budget_bits)
    lo = max(b for b in bits if b <= budget_bits)
    alloc = torch.full((n,), hi, dtype=torch.long)
    n_low = 0 if hi == lo else math.ceil(n * (hi - budget_bits) / (hi - lo) - 1e-9)
    alloc[torch.randperm(n, generator=generator)[:n_low]] = lo
    return alloc


def gini(x: Tensor) -> float:
    """The Gini coefficient of non-negative values: 0 when all are equal, (n - 1)/n when one holds all."""
    v = torch.sort(x.detach().double().flatten()).values
    n, total = v.numel(), float(v.sum())
    if n == 0 or total <= 0:
        return 0.0
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return float(((2 * i - n - 1) * v).sum() / (n * total))


# --- tiles ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TiledWeight:
    """One ``blocks.*`` weight cut into tiles: its state-dict key, shape, and its tiles' slice in the flat
    block index (row-major over the tile grid)."""

    name: str
    rows: int
    cols: int
    offset: int
    tile: int

    @property
    def n_tiles(self) -> int:
        return self.rows * self.cols

    def view(self, flat: Tensor) -> Tensor:
        """This weight's tiles of a flat per-block tensor, as the (rows, cols) tile grid."""
        return flat[self.offset : self.offset + self.n_tiles].view(self.rows, self.cols)


def tile_layout(net: nn.Module, tile: int) -> list[TiledWeight]:
    """Every 2-D ``blocks.*`` weight of ``net`` as tiles; a tile that does not divide a weight is a ConfigError."""
    out, offset = [], 0
    for name, p in net.named_parameters():
        if not name.startswith("blocks.") or p.dim() != 2:
            continue
        r, c = p.shape
        if tile <= 0 or r % tile or c % tile:
            raise ConfigError(
                f"tile={tile} does not divide {name} of shape ({r}, {c}); choose a tile dividing every width"
            )
        out.append(TiledWeight(name, r // tile, c // tile, offset, tile))
        offset += (r // tile) * (c // tile)
    if not out:
        raise ConfigError("the network has no blocks.* linear weights to quantise (a TinyGPT has them)")
    return out


def tile_sums(x: Tensor, tile: int) -> Tensor:
    """Sum of ``x (R t, C t)`` over each ``t x t`` tile: ``(R, C)``."""
    r, c = x.shape[0] // tile, x.shape[1] // tile
    return x.reshape(r, tile, c, tile).sum((1, 3))


def expand_tiles(v: Tensor, tile: int) -> Tensor:
    """A per-tile ``(R, C)`` tensor spread to its elements ``(R t, C t)``."""
    return v.repeat_interleave(tile, 0).repeat_interleave(tile, 1)


# --- reordering ----------------------------------------------------------------------------------------------
def chains(net: TinyGPT) -> list[tuple[str, str, list[range]]]:
    """The foldable chains of every block: ``(producer weight, consumer weight, groups)``; the producer's rows
    ``groups`` (each permuted within itself) feed the consumer's columns ``0..`` in order."""
    out = []
    for i, block in enumerate(net.blocks):
        hidden = block.mlp.fc.out_features
        out.append((f"blocks.{i}.mlp.fc.weight", f"blocks.{i}.mlp.proj.weight", [range(hidden)]))
        c, h = block.attn.proj.in_features, block.attn.n_head
        dh = c // h
        out.append(
            (f"blocks.{i}.attn.qkv.weight", f"blocks.{i}.attn.proj.weight",
             [range(2 * c + j * dh, 2 * c + (j + 1) * dh) for j in range(h)])
        )
    return out


@torch.no_grad()
def reorder_channels(
    net: TinyGPT, sens: dict[str, Tensor], mode: Reorder, also: Sequence[dict[str, Tensor]] = ()
) -> dict[str, Tensor]:
    """Permute each chain's hidden channels by descending score, in place, function unchanged.

    ``sens`` holds the element sensitivities of the producer and consumer weights; the score of channel j is
    the producer's row sum (``rows``), the consumer's column sum (``cols``) or both. The per-weight tensors of
    ``also`` (gradients, Fisher diagonals) are permuted with their weights. Returns the permutation of every
    producer (its row order; the consumer's column order is that minus the group's offset).
    """
    params = dict(net.named_parameters())
    perms: dict[str, Tensor] = {}
    if mode == "none":
        return perms
    for prod, cons, groups in chains(net):
        start = groups[0].start
        row_score = sens[prod].sum(1)
        col_score = sens[cons].sum(0)
        perm = torch.arange(params[prod].shape[0])
        for g in groups:
            rows = torch.arange(g.start, g.stop)
            score = torch.zeros(len(g), dtype=torch.float64)
            if mode in ("rows", "both"):
                score += row_score[rows].double()
            if mode in ("cols", "both"):
                score += col_score[rows - start].double()
            perm[rows] = rows[torch.argsort(score, descending=True, stable=True)]
        params[prod].copy_(params[prod][perm])
        bias = prod.removesuffix("weight") + "bias"
        if bias in params:
            params[bias].copy_(params[bias][perm])
        cols = perm[start : start + params[cons].shape[1]] - start
        params[cons].copy_(params[cons][:, cols])
        for d in also:
            d[prod], d[cons] = d[prod][perm], d[cons][:, cols]
        perms[prod] = perm
    return perms


# --- the tasks -------------------------------------------------------------------------------------------------
class ScaleBITSFP(CausalLMTask):
    """The full-precision model ScaleBITS quantises: next-character training of a ``TinyGPT`` (``CausalLMTask``)."""

    paper_id = "004-09"
    monitor = "val/bpb"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet

    def __init__(
        self,
        net: NetFactory = fp_net,
        input_shape: tuple[int, ...] = (128,),
        num_classes: int = 128,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(net, input_shape, num_classes, optimizer, lr_scheduler)


def load_fp(path: str) -> TinyGPT:
    if not Path(path).is_file():
        raise ConfigError(
            f"fp_ckpt {path!r} does not exist; train it with python main.py fit --config configs/scalebits/fp.yaml "
            "(or set model.fp_ckpt null to train it in this fit)"
        )
    return load_lm(path)


class ScaleBITSQuantizer(PaperTask):
    """Mixed-precision bit allocation for a fixed FP ``TinyGPT`` (module docstring).

    Args:
        fp_ckpt: the FP model (a ``ScaleBITSFP`` checkpoint); None: train ``net`` for ``fp_steps`` first.
        fp_steps: FP training steps when ``fp_ckpt`` is None (with ``optimizer``).
        net: the FP architecture when ``fp_ckpt`` is None.
        bits: the bit widths a block may take, ascending.
        budget_bits: the average bits per weight the allocation must reach.
        tile: blocks are ``tile x tile`` tiles of every ``blocks.*`` weight.
        group_size: RTN group (columns of a row) inside a tile; divides ``tile``.
        sensitivity: g and F at the current quantised model (``dynamic``) or at the FP model (``static``).
        allocation: ``greedy`` (Delta_b rounds), ``uniform`` (every block at ``budget_bits``) or ``random``.
        reorder: channel reordering before allocation: ``none``, ``rows``, ``cols`` or ``both``.
        round_frac: share of blocks lowered per greedy round.
        calib_batches: calibration batches (the first training batches after the FP stage).
        input_shape, num_classes: linked from the DataModule (context, vocabulary).
        optimizer, lr_scheduler: for the FP stage only.
    """

    paper_id = "004-09"
    monitor = "val/bpb"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: it optimises manually (automatic_optimization = False)
    summary_metrics = ("val/bpb_fp", "val/bpb_increase", "val/avg_bits")

    def __init__(
        self,
        fp_ckpt: str | None = None,
        fp_steps: int = 1500,
        net: NetFactory = fp_net,
        bits: list[int] | None = None,
        budget_bits: float = 2.5,
        tile: int = 16,
        group_size: int = 16,
        sensitivity: Sensitivity = "dynamic",
        allocation: Allocation = "greedy",
        reorder: Reorder = "both",
        round_frac: float = 0.05,
        calib_batches: int = 32,
        input_shape: tuple[int, ...] = (128,),
        num_classes: int = 128,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        names = ("bpb", "bpb_fp", "bpb_increase", "avg_bits", "sensitivity_gini")
        super().__init__(optimizer, lr_scheduler, {k: WeightedMean() for k in names})
        self.automatic_optimization = False
        self.bits = list(bits) if bits is not None else [2, 3, 4]
        check_bits(self.bits, budget_bits)
        if allocation == "uniform" and budget_bits not in self.bits:
            raise ConfigError(f"allocation=uniform puts every block at budget_bits: choose one of bits {self.bits}")
        if not 0 < round_frac <= 1 or calib_batches < 1 or fp_steps < 0:
            raise ConfigError("need 0 < round_frac <= 1, calib_batches >= 1 and fp_steps >= 0")
        if group_size <= 0 or tile % group_size:
            raise ConfigError(f"group_size={group_size} must divide tile={tile} (RTN groups stay inside a tile)")
        self.budget_bits, self.tile, self.group_size = budget_bits, tile, group_size
        self.sensitivity, self.allocation, self.reorder = sensitivity, allocation, reorder
        self.round_frac, self.calib_batches = round_frac, calib_batches
        if fp_ckpt is not None:
            self.net = load_fp(fp_ckpt)
            self.fp_steps = 0
        else:
            self.net = net(tuple(input_shape), num_classes)
            self.fp_steps = fp_steps
        if not isinstance(self.net, TinyGPT):
            raise ConfigError(f"ScaleBITS quantises a TinyGPT, got {type(self.net).__name__}")
        if self.net.vocab_size != num_classes or self.net.block_size < tuple(input_shape)[0]:
            raise ConfigError(
                f"the FP model (vocab {self.net.vocab_size}, context {self.net.block_size}) does not fit the data "
                f"(vocab {num_classes}, context {tuple(input_shape)[0]}): quantise a model trained on this data"
            )
        self.layout = tile_layout(self.net, tile)
        n = sum(t.n_tiles for t in self.layout)
        self.block_sizes = torch.full((n,), tile * tile, dtype=torch.long)
        self.register_buffer("alloc", torch.full((n,), self.bits[-1], dtype=torch.long))
        self.register_buffer("ready", torch.tensor(False))  # calibration kept, reordered, caches built
        self.register_buffer("reordered", torch.tensor(False))
        self.register_buffer("done", torch.tensor(False))  # the budget is met
        self.register_buffer("gini", torch.tensor(0.0))
        self.register_buffer("rounds", torch.tensor(0))
        self.calib: list[tuple[Tensor, Tensor]] = []
        self._levels: dict[str, dict[int, Tensor]] | None = None  # Q_b(W) of every weight and width
        self._static: tuple[dict[str, Tensor], dict[str, Tensor]] | None = None

    # --- quantised weights --------------------------------------------------------------------------------------
    def weights(self) -> dict[str, Tensor]:
        params = dict(self.net.named_parameters())
        return {t.name: params[t.name].detach() for t in self.layout}

    def levels(self) -> dict[str, dict[int, Tensor]]:
        """Q_b(W) of every tiled weight at every width (the weights never change after reordering)."""
        if self._levels is None:
            self._levels = {
                name: {b: quantize_rtn(w, b, self.group_size) for b in self.bits} for name, w in self.weights().items()
            }
        return self._levels

    def bits_map(self, alloc: Tensor, t: TiledWeight) -> Tensor:
        return expand_tiles(t.view(alloc), self.tile)

    def select(self, name: str, q: Tensor) -> Tensor:
        """The weight whose every element sits at its bit-width map ``q``'s level."""
        levels = self.levels()[name]
        out = levels[self.bits[0]].clone()
        for b in self.bits[1:]:
            out = torch.where(q == b, levels[b], out)
        return out

    def quantized_state(self, alloc: Tensor | None = None) -> dict[str, Tensor]:
        """The tiled weights at ``alloc`` (default: the current allocation); other parameters stay FP."""
        alloc = self.alloc if alloc is None else alloc
        return {t.name: self.select(t.name, self.bits_map(alloc, t)) for t in self.layout}

    def quantized_logits(self, x: Tensor, alloc: Tensor | None = None) -> Tensor:
        return functional_call(self.net, self.quantized_state(alloc), (x,))

    # --- sensitivities -----------------------------------------------------------------------------------------
    def grad_stats(self, state: dict[str, Tensor] | None) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Mean gradient g and Fisher diagonal F (mean squared batch gradient) of the calibration loss with
        respect to the tiled weights, at ``state`` (None: the FP weights)."""
        if not self.calib:
            raise ConfigError("no calibration batches: the quantiser needs calib_batches training batches")
        base = self.weights() if state is None else state
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in base.items()}
        g = {k: torch.zeros_like(v) for k, v in leaves.items()}
        fisher = {k: torch.zeros_like(v) for k, v in leaves.items()}
        with torch.enable_grad():
            for x, y in self.calib:
                logits = functional_call(self.net, leaves, (x,))
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
                grads = torch.autograd.grad(loss, list(leaves.values()))
                for k, gr in zip(leaves, grads):
                    g[k] += gr
                    fisher[k] += gr * gr
        n = len(self.calib)
        return {k: v / n for k, v in g.items()}, {k: v / n for k, v in fisher.items()}

    def element_sensitivity(self, fisher: dict[str, Tensor]) -> dict[str, Tensor]:
        """s = F (Q_min(W) - W)^2 per element, at the lowest width a block can reach."""
        w = self.weights()
        return {k: fisher[k] * (quantize_rtn(w[k], self.bits[0], self.group_size) - w[k]) ** 2 for k in w}

    def marginal_costs(self, alloc: Tensor) -> Tensor:
        """Delta_b of lowering every block one step from ``alloc`` (0 for blocks already at min(bits))."""
        if self.sensitivity == "static":
            if self._static is None:
                self._static = self.grad_stats(None)
            g, fisher = self._static
        else:
            g, fisher = self.grad_stats(self.quantized_state(alloc))
        lower = lower_bits(alloc, self.bits)
        cost = torch.zeros(alloc.shape, dtype=torch.float64)
        for t in self.layout:
            q, q_low = self.bits_map(alloc, t), self.bits_map(lower, t)
            delta = self.select(t.name, q_low) - self.select(t.name, q)
            per_el = g[t.name] * delta + 0.5 * fisher[t.name] * delta * delta
            cost[t.offset : t.offset + t.n_tiles] = tile_sums(per_el, self.tile).flatten().double().cpu()
        return cost

    # --- the stages ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prepare(self) -> None:
        """After calibration: reorder (once), the Gini of block sensitivities, and the non-greedy allocations."""
        self.net.requires_grad_(False)
        g, fisher = self.grad_stats(None)
        if not bool(self.reordered):
            if self.reorder != "none":
                # g and F move with their weights: no second pass over the calibration set
                reorder_channels(self.net, self.element_sensitivity(fisher), self.reorder, also=(g, fisher))
            self.reordered.fill_(True)
        self._levels, self._static = None, (g, fisher)
        sens = self.element_sensitivity(fisher)
        self.gini.fill_(gini(torch.cat([tile_sums(sens[t.name], self.tile).flatten() for t in self.layout])))
        n = self.alloc.numel()
        if self.allocation == "uniform":
            self.alloc.fill_(int(self.budget_bits))
            self.done.fill_(True)
        elif self.allocation == "random":
            gen = torch.Generator().manual_seed(self.run_seed)
            self.alloc.copy_(random_allocation(n, self.bits, self.budget_bits, gen))
            self.done.fill_(True)
        self.ready.fill_(True)

    def greedy_step(self) -> None:
        k = max(1, math.floor(self.round_frac * self.alloc.numel()))
        cost = self.marginal_costs(self.alloc.clone())
        alloc, done = greedy_round(self.alloc.cpu(), cost, self.block_sizes, self.bits, self.budget_bits, k)
        self.alloc.copy_(alloc)
        self.rounds += 1
        if done:
            self.done.fill_(True)

    def avg_bits(self) -> float:
        return float((self.block_sizes * self.alloc.cpu()).sum() / self.block_sizes.sum())

    # --- Lightning -----------------------------------------------------------------------------------------------
    def step(self, batch: Any, stage: Stage) -> StepOutput:
        x, y = batch[0], batch[1]
        if stage != "train":
            return self.evaluate(x, y, stage)
        opt = self.optimizers()
        opt.zero_grad(set_to_none=True)
        none = {k: None for k in self._metric_names}
        if self.global_step < self.fp_steps:
            loss = F.cross_entropy(self.net(x).flatten(0, 1), y.flatten())
            self.manual_backward(loss)
            opt.step()
            return StepOutput(loss.detach(), n=y.numel(), inputs=none)
        if not bool(self.ready):
            self.calib.append((x.detach().clone(), y.detach().clone()))
            if len(self.calib) >= self.calib_batches:
                self.prepare()
        elif not bool(self.done):
            self.greedy_step()
        opt.step()  # no gradients: nothing moves, the step is counted
        if bool(self.done):
            self.trainer.should_stop = True
        with torch.no_grad():
            logits = self.quantized_logits(x) if bool(self.ready) else self.net(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return StepOutput(loss, n=y.numel(), inputs=none)

    def evaluate(self, x: Tensor, y: Tensor, stage: Stage) -> StepOutput:
        if stage == "test" and not bool(self.done):
            raise ConfigError(
                "the allocation has not met its budget: test a checkpoint whose fit finished (raise trainer.max_steps)"
            )
        n = y.numel()
        with torch.no_grad():
            fp = F.cross_entropy(self.net(x).flatten(0, 1), y.flatten())
            quant = F.cross_entropy(self.quantized_logits(x).flatten(0, 1), y.flatten()) if bool(self.done) else fp
        to_bits = 1 / math.log(2)  # one byte per character target (datamodules.text is ASCII)
        one = torch.tensor(1.0)
        inputs = {
            "bpb": (quant * to_bits, n),
            "bpb_fp": (fp * to_bits, n),
            "bpb_increase": ((quant - fp) * to_bits, n),
            "avg_bits": (torch.tensor(self.avg_bits()), one),
            "sensitivity_gini": (self.gini.detach().clone(), one),
        }
        return StepOutput(quant, n=n, inputs=inputs)

    def on_train_end(self) -> None:
        if not bool(self.done):
            raise ConfigError(
                f"training ended after {self.global_step} steps with the budget unmet (avg {self.avg_bits():.3f} "
                f"bits > {self.budget_bits}): raise trainer.max_steps above fp_steps + calib_batches + the rounds"
            )

    def extra_state(self) -> dict[str, Any]:
        if not self.calib:
            return {}
        return {"calib_x": torch.stack([x for x, _ in self.calib]), "calib_y": torch.stack([y for _, y in self.calib])}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if "calib_x" in state:
            self.calib = list(zip(state["calib_x"].unbind(0), state["calib_y"].unbind(0)))
        self._levels, self._static = None, None
