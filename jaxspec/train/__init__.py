"""Training EAGLE-1 / EAGLE-3 draft heads: data regeneration (data.py), losses (losses.py), loop (trainer.py)."""

from jaxspec.train.data import TokenDataset, draft_vocab, generate_dataset
from jaxspec.train.trainer import export_head, train_eagle

__all__ = ["TokenDataset", "draft_vocab", "export_head", "generate_dataset", "train_eagle"]
