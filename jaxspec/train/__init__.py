"""Training EAGLE-1 / EAGLE-3 draft heads: data regeneration (data.py), losses (losses.py), loop (trainer.py)."""

from jaxspec.train.data import TokenDataset, draft_vocab, generate_dataset, greedy_dataset, read_prompts
from jaxspec.train.tiny import TinyHead, train_tiny_head
from jaxspec.train.trainer import export_head, train_eagle

__all__ = ["TinyHead", "TokenDataset", "draft_vocab", "export_head", "generate_dataset", "greedy_dataset",
           "read_prompts", "train_eagle", "train_tiny_head"]
