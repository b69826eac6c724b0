"""What survives a process: the training state in and out (train_state.py: the
position, the agreed restore, warm start, the guarded save), checkpoints (save,
restore, temporaries), another run's model weights read (model_weights.py), what a
Task holds (task_state.py, keys.py), the SavedModel export, the predictions' folder,
what a resumed run may change (config_changes.py, elastic.py), and the orbax noise
that comes with writing them. Where each file lives and how it is written is the
store's (trainer/store/).

Only the chief writes; every worker reads.
"""
