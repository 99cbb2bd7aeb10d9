"""Frames: a fetched episode demuxed, its GOPs decoded (and cached), items built as LeRobot
builds them."""
