"""Metadata: a dataset's (or a mixture's) info, selected manifest rows, item schema and
statistics, opened concurrently."""
