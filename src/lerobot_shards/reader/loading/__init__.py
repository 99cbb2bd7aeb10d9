"""The PyTorch side: the IterableDataset, its DataLoader and device feed, and the stream that
joins the plan, the bytes and the frames."""
