"""Batches out of DataLoader workers through reused shared memory, for any ``collate_fn``
that ends in ``default_collate``."""
