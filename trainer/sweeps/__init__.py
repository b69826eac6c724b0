"""Sweeps: many distloop runs under a tuner (Optuna, Ray Tune), each trial one model_dir.

A trial is `trainer.run` with an Action that reports each eval to the tuner and stops
the run (a clean stop: finished.json says who stopped it and why) where the tuner prunes
it. A trial that is run again (a study or a driver killed and restarted) resumes from
its model_dir exactly. The tuners are optional extras: `[optuna]`, `[ray]`.
"""
