"""A fine-tuning run: its settings (`run.RunConfig`), their checks and the plan they resolve
to (`run.prepare`), the loop that runs the plan segment by segment (`trainer.Trainer`), the
full training state's checkpoints (`train_state`, `checkpoint_store`, `checkpoint_snapshot`),
held-out scoring (`evaluation`) and the model's Hugging Face folders (`hf_io`,
`model_saves`). Only `run` is imported here: the rest needs torch."""
