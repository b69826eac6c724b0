"""The command line: flags, modes, which file --config means, terminal output,
and each error mapped to the exit code of trainer/errors.py's table.

Apart from the Python API (trainer/api.py) so that a notebook or a worker of a
distributed engine gets exceptions and no process-wide state: only the command
line installs signal handlers and exits the process.
"""
