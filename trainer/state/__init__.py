"""What survives a process: the training state in and out (train_state.py: the
position, the agreed restore, warm start, the guarded save), checkpoints (save,
restore, temporaries), another run's model weights read (model_weights.py), every path of the model_dir layout (model_dir.py), the
SavedModel export, the one-writer lock, what a resumed run may change, and the
storage errors and orbax noise that come with writing them.

Only the chief writes; every worker reads.
"""
