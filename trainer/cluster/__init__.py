"""How processes cooperate: the runtime (strategies, TF_CONFIG, Slurm), one agreed
decision per loop boundary (agreement.py), the stop-at-a-safe-step protocol for
SIGTERM (preemption.py), and the local launcher (launch.py, run as
`python -m trainer.launch`; each process it starts: launch_tasks.py).
"""
