"""The job as data, pure (no Slurm contacted, nothing written): the spec (spec.py) and what it is made from
(parse, ids, quoting, sbatch_options), where its defaults come from (config, trust, clusters), what it will be
(explain), a job array's tasks as data (array) and the skeleton of ``clusterddp new``. Login side: never imports
torch."""
