"""A cluster reached over SSH: the connection (connection.py), the copy of the project's code there (copy.py) and
its jobs' files read back here (mirror.py). The only place clusterddp runs ssh or rsync."""
