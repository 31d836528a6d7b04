"""Self-healing: what a failed attempt left behind (logscan, faults: the program or a node), the attempts a job
made (attempts) and the nodes found at fault (quarantine)."""
