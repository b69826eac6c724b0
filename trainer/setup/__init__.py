"""What runs before TensorFlow loads: a config's start-up checks and the plug-ins it names.

Nothing here imports TensorFlow (tests/docs/test_layout.py), so a bad field fails in a
fraction of a second with one line. `validation.py` checks every field (the fields that
need the runtime are checked where they act: trainer/cluster/runtime.py, and
checkpoint.init_from in trainer/store/model_dir.py); `plugins.py` resolves MODULE:FUNCTION
and loads the data; `module_names.py` refuses a user's module named like distloop's
packages; `names.py` is the one list of built-in names; `heads.py` parses a multi-output
model's per-output losses, weights and metrics; `epochs.py` turns train.epochs into
steps; `run_fields.py` says which of a Task's own config fields a resume may change.
"""
