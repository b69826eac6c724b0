"""`python -m trainer.verify`: the guarantee checks run on the user's own job.

processes.py watches and signals a trainer process; digests.py records, at each step of
every verify run, a digest of each variable a checkpoint holds (a `train.actions` entry),
and finds where two runs first part; checks.py runs the job the ways a guarantee names
(uninterrupted, SIGTERMed and SIGKILLed then resumed, on other replica counts, resumed on
another count, evaluated and exported from its checkpoint in a fresh process) and judges
each against its bound; report.py prints the table and what usually causes a difference;
__main__.py is the command line. tests/guarantees runs its workloads through the same
processes, digests and judgments.
"""
