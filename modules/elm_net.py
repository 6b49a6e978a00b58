"""ELM-Net (paper 004-05): a recurrent layer of Expressive Leaky Memory neurons, and how a parameter budget P is
best split between the number of neurons N, their complexity (memory size d_m) and their connectivity k_c.

One ELM neuron (Spieler et al. 2024, the reference code's v2 neuron) at step t, with ``w_s = ReLU(w~_s)``::

    b_t  = exp(-dt/tau_b) b_{t-1} + sum_{syn in branch} w_s s_t          (n_branches traces)
    Dm_t = 1.7159 tanh((2/3) MLP([b_t, kappa_m m_{t-1}]))                 (hidden width h = 2 d_m)
    m_t  = kappa_m m_{t-1} + (1 - kappa_lambda) Dm_t,   kappa_m = exp(-dt/tau_m), kappa_lambda = exp(-lambda dt/tau_m)
    y_t  = w_y . m_t + b_y

Neuron i's k_c synapses ``s_t`` read fixed random entries ``conn[i]`` of ``[x_t || y_{t-1}]`` (the external
channels and every neuron's previous output), in ``n_branches`` contiguous groups. A linear readout maps the N
outputs to the task's outputs at the last step (sequence classification) or at every step (character LM).

All N neurons run at once: the synapses become one dense (n_in + N, N * n_branches) matrix (the input part of
the drive is one matmul over all steps), the per-neuron MLPs batched matmuls over neurons; one Python loop
over time. ``elm_network_forward`` is that computation on explicit parameters, ``budget_config`` solves for
the largest (N, d_m) pair under a budget P, counted over every trainable parameter, the readout included.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.metrics import Accuracy, count_parameters

#: the LeCun-scaled tanh of the reference neuron: 1.7159 tanh(2x/3)
TANH_GAIN, TANH_SLOPE = 1.7159, 2.0 / 3.0
PARAM_NAMES = ("w_s", "conn", "W1", "b1", "W2", "b2", "tau_m", "w_y", "b_y")


def synapse_matrix(w: Tensor, conn: Tensor, n_sources: int, n_branches: int) -> Tensor:
    """The synapses as one dense matrix ``(n_sources, N * n_branches)``: entry ``(s, i * n_branches + g)`` sums
    the weights ``w (N, k_c)`` of neuron i's synapses in branch g that read source s (``conn (N, k_c)``)."""
    n, k = w.shape
    per = k // n_branches
    neuron = torch.arange(n, device=w.device)[:, None].expand(n, k)
    branch = (torch.arange(k, device=w.device) // per)[None, :].expand(n, k)
    flat = torch.zeros(n_sources, n * n_branches, dtype=w.dtype, device=w.device)
    # accumulate: a source read twice by one branch counts twice, as two synapses would
    return flat.index_put((conn.reshape(-1), (neuron * n_branches + branch).reshape(-1)), w.reshape(-1), accumulate=True)


def elm_network_forward(
    x: Tensor,
    params: dict[str, Tensor],
    n_branches: int,
    tau_b: float = 5.0,
    lambda_value: float = 5.0,
    dt: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """A recurrent layer of N ELM neurons on ``x (B, T, n_in)`` from zero states: ``(y (B, T, N), m (B, T, N, d_m))``.

    ``params``: ``w_s (N, k_c)`` raw synaptic weights (``ReLU`` is applied here), ``conn (N, k_c)`` long indices
    into ``[x_t || y_{t-1}]``, ``W1 (N, n_branches + d_m, h)``, ``b1 (N, h)``, ``W2 (N, h, d_m)``, ``b2 (N, d_m)``,
    ``tau_m (N, d_m)`` time constants, ``w_y (N, d_m)``, ``b_y (N,)``; the MLP is ``ReLU(inp @ W1 + b1) @ W2 + b2``.
    """
    missing = [k for k in PARAM_NAMES if k not in params]
    if missing:
        raise ConfigError(f"elm_network_forward: params lack {missing}; give all of {list(PARAM_NAMES)}")
    if x.dim() != 3:
        raise ConfigError(f"elm_network_forward takes x of shape (B, T, n_in), got {tuple(x.shape)}")
    w_s, conn = params["w_s"], params["conn"]
    W1, b1, W2, b2 = params["W1"], params["b1"], params["W2"], params["b2"]
    tau_m, w_y, b_y = params["tau_m"], params["w_y"], params["b_y"]
    bsz, n_steps, n_in = x.shape
    n, k = w_s.shape
    d_m = tau_m.shape[1]
    if k % n_branches or W1.shape[1] != n_branches + d_m:
        raise ConfigError(f"k_c={k} must split into n_branches={n_branches} groups and W1 must read "
                          f"n_branches + d_m = {n_branches + d_m} inputs, got {W1.shape[1]}")
    w = F.relu(w_s).to(x.dtype)
    from_x = conn < n_in
    # the external drive of every branch at every step in one matmul: (T, N, B, n_branches); unbind, not
    # indexing, so that backward stacks the T step gradients once instead of adding T full-size zero tensors
    syn_x = synapse_matrix(w * from_x, conn.clamp(max=n_in - 1), n_in, n_branches)
    drive = (x @ syn_x).view(bsz, n_steps, n, n_branches).permute(1, 2, 0, 3).unbind(0)
    # the recurrent synapses by gather: N k_c reads per step instead of a dense (N, N n_branches) matmul
    w_rec = (w * ~from_x)[:, :, None]  # (N, k_c, 1); synapses reading an input channel weigh 0 here
    src_rec = (conn - n_in).clamp(min=0).reshape(-1)
    kappa_b = math.exp(-dt / tau_b)
    kappa_m = torch.exp(-dt / tau_m)[:, None, :]  # (N, 1, d_m)
    gate = (1.0 - torch.exp(-lambda_value * dt / tau_m))[:, None, :]
    b1_, b2_, w_y_ = b1[:, None, :], b2[:, None, :], w_y[:, None, :]
    # states in (N, B, .) layout, so each neuron's MLP is one slice of a batched matmul
    b = x.new_zeros(n, bsz, n_branches)
    m = x.new_zeros(n, bsz, d_m)
    y = x.new_zeros(n, bsz)
    ys, ms = [], []
    for t in range(n_steps):
        reads = y[src_rec].view(n, k, bsz)  # what each recurrent synapse reads from y_{t-1}
        rec = (reads * w_rec).view(n, n_branches, k // n_branches, bsz).sum(2).transpose(1, 2)
        b = kappa_b * b + drive[t] + rec
        m_decayed = kappa_m * m
        hidden = torch.relu(torch.baddbmm(b1_, torch.cat([b, m_decayed], -1), W1))
        proposal = TANH_GAIN * torch.tanh(TANH_SLOPE * torch.baddbmm(b2_, hidden, W2))
        m = m_decayed + gate * proposal
        y = (m * w_y_).sum(-1) + b_y[:, None]
        ys.append(y)
        ms.append(m)
    return torch.stack(ys, 0).permute(2, 0, 1), torch.stack(ms, 0).permute(2, 0, 1, 3)


def elm_param_count(
    n_inputs: int, n_outputs: int, n_neurons: int, d_memory: int, mlp_hidden: int | None = None, k_conn: int = 16,
    n_branches: int = 4, learn_tau: bool = False,
) -> int:
    """Trainable parameters of an ``ELMNetwork`` in closed form: per neuron ``k_c`` synapses, the MLP
    ``(n_branches + d_m) h + h + h d_m + d_m``, the output ``d_m + 1`` (and ``d_m`` time constants when
    learned); the readout ``N n_out + n_out``. ``n_inputs`` does not enter: connectivity is sparse."""
    h = mlp_hidden or 2 * d_memory
    per = k_conn + (n_branches + d_memory) * h + h + h * d_memory + d_memory + d_memory + 1
    per += d_memory if learn_tau else 0
    return n_neurons * per + n_neurons * n_outputs + n_outputs


class ELMNetwork(nn.Module):
    """A recurrent layer of ``n_neurons`` ELM neurons plus a linear readout (module docstring).

    Args:
        n_inputs: external input channels (linked from the data by ``ELMTask``).
        n_outputs: readout outputs (classes, or the vocabulary).
        n_neurons: N, the number of neurons.
        d_memory: d_m, memory units per neuron (sets the per-neuron complexity k_e with ``mlp_hidden``).
        mlp_hidden: h, the MLP's hidden width (default 2 d_m, as in the reference neuron).
        k_conn: k_c, synapses per neuron, drawn without repetition from the n_inputs + N sources.
        n_branches: dendritic branches per neuron (k_c splits into this many contiguous groups).
        tau_range: (tau_min, tau_max): the memory time constants, log-spaced over a neuron's d_m units.
        learn_tau: learn tau_m (through a scaled sigmoid onto tau_range) instead of keeping it fixed.
        lambda_value: lambda, the memory's update gate ``1 - exp(-lambda dt / tau_m)``.
        tau_b: the branch traces' time constant.
        seed: seed of the fixed random wiring ``conn``.
        param_budget: P the network must fit in (ConfigError when it has more trainable parameters);
            None: no check. Sweeps over (N, d_m) pairs of one budget set it, so their runs carry P as a param.
    """

    def __init__(
        self,
        n_inputs: int = 70,
        n_outputs: int = 19,
        n_neurons: int = 32,
        d_memory: int = 16,
        mlp_hidden: int | None = None,
        k_conn: int = 16,
        n_branches: int = 4,
        tau_range: tuple[float, float] = (1.0, 1000.0),
        learn_tau: bool = False,
        lambda_value: float = 5.0,
        tau_b: float = 5.0,
        seed: int = 0,
        param_budget: int | None = None,
    ) -> None:
        super().__init__()
        if min(n_inputs, n_outputs, n_neurons, d_memory, k_conn, n_branches) < 1 or (mlp_hidden or 1) < 1:
            raise ConfigError("n_inputs, n_outputs, n_neurons, d_memory, mlp_hidden, k_conn and n_branches must be >= 1")
        if k_conn % n_branches:
            raise ConfigError(f"k_conn={k_conn} must be divisible by n_branches={n_branches}; "
                              f"set k_conn to a multiple of {n_branches}")
        if k_conn > n_inputs + n_neurons:
            raise ConfigError(f"k_conn={k_conn} exceeds the n_inputs + n_neurons = {n_inputs + n_neurons} sources a "
                              f"neuron can read; lower k_conn or raise n_neurons")
        tau_min, tau_max = tau_range
        if not 0 < tau_min < tau_max:
            raise ConfigError(f"tau_range must be (tau_min, tau_max) with 0 < tau_min < tau_max, got {tau_range}")
        self.n_inputs, self.n_outputs, self.n_neurons, self.d_memory = n_inputs, n_outputs, n_neurons, d_memory
        self.k_conn, self.n_branches, self.learn_tau = k_conn, n_branches, learn_tau
        self.tau_range = (float(tau_min), float(tau_max))
        self.lambda_value, self.tau_b = lambda_value, tau_b
        h = mlp_hidden or 2 * d_memory
        self.mlp_hidden = h
        gen = torch.Generator().manual_seed(seed)
        conn = torch.rand(n_neurons, n_inputs + n_neurons, generator=gen).argsort(-1)[:, :k_conn]
        self.register_buffer("conn", conn)
        self.w_s = nn.Parameter(torch.rand(n_neurons, k_conn))
        fan1, fan2 = n_branches + d_memory, h
        self.W1 = nn.Parameter(torch.empty(n_neurons, fan1, h).uniform_(-1, 1) / math.sqrt(fan1))
        self.b1 = nn.Parameter(torch.empty(n_neurons, h).uniform_(-1, 1) / math.sqrt(fan1))
        self.W2 = nn.Parameter(torch.empty(n_neurons, h, d_memory).uniform_(-1, 1) / math.sqrt(fan2))
        self.b2 = nn.Parameter(torch.empty(n_neurons, d_memory).uniform_(-1, 1) / math.sqrt(fan2))
        self.w_y = nn.Parameter(torch.empty(n_neurons, d_memory).uniform_(-1, 1) / math.sqrt(d_memory))
        self.b_y = nn.Parameter(torch.zeros(n_neurons))
        tau0 = torch.logspace(math.log10(tau_min), math.log10(tau_max), d_memory).expand(n_neurons, d_memory).clone()
        if learn_tau:
            inner = ((tau0 - tau_min) / (tau_max - tau_min)).clamp(1e-6, 1 - 1e-6)
            self.tau_raw = nn.Parameter(torch.log(inner / (1 - inner)))
        else:
            self.register_buffer("tau_fixed", tau0)
        self.readout = nn.Linear(n_neurons, n_outputs)
        if param_budget is not None and (p := count_parameters(self)) > param_budget:
            raise ConfigError(f"ELMNetwork(N={n_neurons}, d_m={d_memory}, k_c={k_conn}) has {p} trainable parameters, "
                              f"over param_budget={param_budget}; take the pair budget_config gives")
        self.param_budget = param_budget

    def tau_m(self) -> Tensor:
        """The memory time constants ``(N, d_m)``."""
        if self.learn_tau:
            lo, hi = self.tau_range
            return lo + (hi - lo) * torch.sigmoid(self.tau_raw)
        return self.tau_fixed

    def layer_params(self) -> dict[str, Tensor]:
        """This layer's parameters in ``elm_network_forward``'s form."""
        return {"w_s": self.w_s, "conn": self.conn, "W1": self.W1, "b1": self.b1, "W2": self.W2, "b2": self.b2,
                "tau_m": self.tau_m(), "w_y": self.w_y, "b_y": self.b_y}

    def hidden(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(y (B, T, N), m (B, T, N, d_m))`` on ``x (B, T, n_inputs)``."""
        if x.dim() != 3 or x.shape[-1] != self.n_inputs:
            raise ConfigError(f"ELMNetwork takes (B, T, {self.n_inputs}) inputs, got {tuple(x.shape)}")
        return elm_network_forward(x.to(self.W1.dtype), self.layer_params(), self.n_branches, self.tau_b,
                                   self.lambda_value)

    def forward(self, x: Tensor, every_step: bool = False) -> Tensor:
        """Logits at the last step ``(B, n_outputs)``, or at every step ``(B, T, n_outputs)``."""
        y, _ = self.hidden(x)
        return self.readout(y if every_step else y[:, -1])


def budget_config(
    P: int, k_conn: int, n_neurons: int | None = None, d_memory: int | None = None, **net_kwargs: Any
) -> dict[str, int]:
    """Given one of ``n_neurons`` / ``d_memory``, the largest other whose ``ELMNetwork(n_neurons, d_memory,
    k_conn, **net_kwargs)`` has at most P trainable parameters, readout included: ``{"n_neurons", "d_memory",
    "params"}``. ``net_kwargs``: the other ``ELMNetwork`` arguments (``n_inputs``, ``n_outputs``, ...)."""
    if (n_neurons is None) == (d_memory is None):
        raise ConfigError("budget_config: give exactly one of n_neurons and d_memory (the other is solved for)")
    allowed = {"n_inputs", "n_outputs", "mlp_hidden", "n_branches", "learn_tau"}
    counted = {k: v for k, v in net_kwargs.items() if k in allowed}
    base = {"n_inputs": 70, "n_outputs": 19, **counted}

    def count(n: int, d: int) -> int:
        return elm_param_count(base["n_inputs"], base["n_outputs"], n, d, base.get("mlp_hidden"), k_conn,
                               base.get("n_branches", 4), base.get("learn_tau", False))

    def solve(fixed_n: int | None, fixed_d: int | None) -> int:
        # the count grows with the free value, so double to an upper end, then bisect to the last one that fits
        at = (lambda v: count(fixed_n, v)) if fixed_n is not None else (lambda v: count(v, fixed_d))  # type: ignore[arg-type]
        if at(1) > P:
            what = f"n_neurons={fixed_n}" if fixed_n is not None else f"d_memory={fixed_d}"
            raise ConfigError(f"budget P={P} is below one neuron's {at(1)} parameters at {what}, k_conn={k_conn}; "
                              f"raise P to at least {at(1)}")
        lo, hi = 1, 2
        while at(hi) <= P:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if at(mid) <= P else (lo, mid)
        return lo

    if n_neurons is not None:
        d_memory = solve(n_neurons, None)
    else:
        n_neurons = solve(None, d_memory)
    assert n_neurons is not None and d_memory is not None
    if k_conn > base["n_inputs"] + n_neurons:
        raise ConfigError(f"k_conn={k_conn} exceeds n_inputs + n_neurons = {base['n_inputs'] + n_neurons} at P={P}; "
                          "lower k_conn")
    return {"n_neurons": n_neurons, "d_memory": d_memory, "params": count(n_neurons, d_memory)}


class ELMTask(PaperTask):
    """An ELM network on sequence classification (spike adding: the class at the last step) or character-level
    language modelling (the next character at every step, bits per character).

    Batches: ``seq_class``: ``(x (B, T, n_in) spikes, y (B,) classes)``; ``char_lm``: ``(x (B, T) ids, y (B, T)
    ids)``, the ids one-hot over ``num_classes`` input channels. Logs ``acc`` (and ``bpc`` for ``char_lm``) and
    ``P`` (``count_parameters`` of the network, readout included) every epoch.

    Args:
        net: the network, ``net(n_inputs, n_outputs)``: ``modules.elm_net.ELMNetwork`` with its ``init_args``.
        task: ``seq_class`` or ``char_lm``.
        input_shape: one sample's shape, ``(T, n_in)`` or ``(T,)`` (linked from the DataModule).
        num_classes: classes, or the vocabulary (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask`` (default AdamW, lr 3e-3).
    """

    paper_id = "004-05"
    monitor = "val/acc"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet

    def __init__(
        self,
        net: Callable[[int, int], nn.Module] = ELMNetwork,
        task: Literal["seq_class", "char_lm"] = "seq_class",
        input_shape: tuple[int, ...] = (110, 70),
        num_classes: int = 19,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, metrics={"acc": Accuracy(), "bpc": WeightedMean()})
        shape = tuple(input_shape)
        if task == "seq_class" and len(shape) != 2:
            raise ConfigError(f"task seq_class takes samples of shape (T, n_in), got input_shape {shape}; "
                              "use task: char_lm for token data")
        if task == "char_lm" and len(shape) != 1:
            raise ConfigError(f"task char_lm takes token sequences of shape (T,), got input_shape {shape}; "
                              "use task: seq_class for (T, n_in) inputs")
        self.task, self.num_classes = task, num_classes
        n_inputs = shape[-1] if task == "seq_class" else num_classes
        built = net(n_inputs, num_classes)
        if not isinstance(built, ELMNetwork):  # the task reads its memory and time constants
            raise ConfigError(f"net must build a modules.elm_net.ELMNetwork, got {type(built).__name__}")
        self.net = built

    def inputs(self, x: Tensor) -> Tensor:
        """The network's input ``(B, T, n_in)``: spikes as floats, token ids one-hot."""
        if self.task == "char_lm":
            return F.one_hot(x.long(), self.num_classes).float()
        return x.float()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.inputs(x), every_step=self.task == "char_lm")

    def step(self, batch: tuple[Tensor, Tensor], stage: Stage) -> StepOutput:
        x, y = batch
        logits = self(x)
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1).long()
        loss = F.cross_entropy(logits, y)
        bpc = (loss.detach() / math.log(2), y.numel()) if self.task == "char_lm" else None
        return StepOutput(loss, n=y.numel(), preds=logits.argmax(-1), target=y, inputs={"bpc": bpc})

    def memory_usage(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``modules.protocols.MemoryUsage``: ``(tau_m (N, d_m), mean |m| (N, d_m))`` over the batch's samples and
        steps."""
        was = self.training
        self.eval()
        try:
            with torch.no_grad():
                _, m = self.net.hidden(self.inputs(batch[0]))
                return self.net.tau_m().detach().clone(), m.abs().mean((0, 1))
        finally:
            self.train(was)

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        return {f"{stage}/P": torch.tensor(float(count_parameters(self.net)))}
