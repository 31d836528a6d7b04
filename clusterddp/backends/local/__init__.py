"""The local backend: the same job spec on this machine with no Slurm (plan.py builds the processes each launcher
would start, run.py starts and ends them)."""
