"""Training: the engine (one epoch, evaluation), checkpoints, and the run loop."""
