"""The streaming reader: plan (pure), fetch, decode and the dataset."""
