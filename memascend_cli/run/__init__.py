"""One training run: the recipe and its LLaMA-Factory translation, the DeepSpeed config, run setup shared by
`plan RECIPE`, `train` and `bench` (prepared), the launch and its host files, the run directory contract, preflight
checks and clean-up of what a dead run left behind."""
