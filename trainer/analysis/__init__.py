"""What a Task's traced steps do, read from their graphs: the stateful ops they run
(`stateful_ops.py`) and whether a step's values depend on the replica count
(`replica_dependence.py`). state/ asks it before saving or resuming; it saves nothing.
"""
