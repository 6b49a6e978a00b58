"""Neural spike tokenizer benchmark (paper 002-08): five tokenizers trained on reconstruction only, evaluated on
reconstruction, decoding, encoding, latent structure, firing statistics, robustness, compression and held-out
sessions (``task.py``); the tokenizers in ``tokenizers.py``, the probes and measures in ``probes.py``."""

from modules.spike_tokenizers.task import ProvidesProbeSplit, SpikeTokenizerAE, poisson_nll
from modules.spike_tokenizers.tokenizers import Kind, build_tokenizer, token_bits_per_second

__all__ = ["Kind", "ProvidesProbeSplit", "SpikeTokenizerAE", "build_tokenizer", "poisson_nll", "token_bits_per_second"]
