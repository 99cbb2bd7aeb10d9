"""The README's main job, end to end: make, convert, stream with workers, train."""

from lerobot_shards.demo import DEMO_EPISODE_LENGTHS, format_report, run_demo


def test_demo_covers_every_frame_once_and_trains(tmp_path):
    report = run_demo(tmp_path / "demo", workers=2, batch_size=8)
    assert report.frames == sum(DEMO_EPISODE_LENGTHS)
    assert report.distinct_seen == report.frames
    assert report.samples_seen == report.frames + report.padding
    assert report.duplicates == report.padding
    # the loader's batches mix both workers' samples: one batch per 8 samples of the epoch
    assert report.train_steps == -(-report.samples_seen // 8)
    assert report.losses[-1] < report.losses[0]
    assert "every frame exactly once" in format_report(report)
