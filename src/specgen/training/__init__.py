"""`specgen train` (in progress): target data, training blocks, losses, checkpoints."""
