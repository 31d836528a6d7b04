"""Sweeps: a parameter grid as one job array (grid: trials as data; run: the array; flow: what ``clusterddp sweep``
does; status: the table; api: map_array's configs as a sweep's trials)."""
