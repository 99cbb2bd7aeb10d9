"""Bytes: an episode's span fetched from any fsspec root (ranged, verified, retried, within
the byte budget), or mapped from a local shard with its pages given back once decoded."""
