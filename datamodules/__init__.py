"""Data sources shared by every method: in-memory tensor sets behind a fast batched loader, and the hub path."""

from datamodules.base import BatchedTensorLoader, TensorDataModule
from datamodules.digits import DigitsDataModule
from datamodules.yinyang import YinYangDataModule

__all__ = ["BatchedTensorLoader", "DigitsDataModule", "TensorDataModule", "YinYangDataModule"]
