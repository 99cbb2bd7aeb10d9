"""The pure plan: each epoch's mixture, split, pool order and resume point.

numpy only: no torch, no I/O, so it imports and is tested on its own. Everything above it
(fetching, decoding, the PyTorch side) follows the events it returns."""
