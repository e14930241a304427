"""The capacity planner: pure, stdlib-only arithmetic over model, hardware and job specs."""
