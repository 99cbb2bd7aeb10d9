"""LeRobot dataset -> per-episode tar shards and a manifest (see ``run.convert``)."""
