"""Training EAGLE-1 / EAGLE-3 draft heads: data regeneration (data.py), losses (losses.py), loop (trainer.py),
self-written prompts (magpie.py), the `jaxspec train-eagle` command (command.py).

Nothing is imported here: the CLI builds `train-eagle`'s parser from magpie.py on every `jaxspec` start, and the
training loop's imports (optax, the trainer) belong to training only."""
