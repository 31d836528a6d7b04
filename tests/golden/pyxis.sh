#!/bin/bash
#SBATCH --ignore-pbs
#SBATCH --job-name=train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --array=0-3%2
#SBATCH --dependency=afterok:1234
#SBATCH --output=clusterddp-runs/train-%j.out
#
# Rendered by clusterddp <version>: 2 node(s) x 4 rank(s) per node = world size 8
# launcher: torchrun, backend: nccl. Regenerate rather than edit: clusterddp render --help
set -euo pipefail

# Set here, not inherited: a stop file from the submitting shell would stop these ranks.
unset CLUSTERDDP_STOP_FILE
export PYTHONUNBUFFERED=1
export CLUSTERDDP_LAUNCHER=torchrun
export CLUSTERDDP_NNODES=2
export CLUSTERDDP_GPUS_PER_NODE=4
export CLUSTERDDP_PROCS_PER_NODE=4
export CLUSTERDDP_WORLD_SIZE=8
export CLUSTERDDP_HANG_TIMEOUT=900
export OMP_NUM_THREADS=1

# Slurm's variables are data: bash evaluates a variable's text as arithmetic inside $(( )) and [ -ge ], so
# anything but digits could run code there, and a '/' would move the run directory. Check before use.
case "${SLURM_JOB_ID:-}" in
    ''|*[!0-9]*) echo "clusterddp: SLURM_JOB_ID='${SLURM_JOB_ID:-}' is not a job id; submit this script with sbatch" >&2; exit 1 ;;
esac
export CLUSTERDDP_RESTARTS="${SLURM_RESTART_COUNT:-0}"
# The hang watchdog's progress counter lives in the rendezvous store under this secret name, so that a process
# that can reach MASTER_PORT (anyone on the network) can neither keep a hung job alive nor switch the watchdog off.
export CLUSTERDDP_WATCH_KEY="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
case "$CLUSTERDDP_RESTARTS" in
    ''|*[!0-9]*) echo "clusterddp: SLURM_RESTART_COUNT='$CLUSTERDDP_RESTARTS' is not a number" >&2; exit 1 ;;
esac

# MASTER_ADDR: the first host of the allocation. scontrol prints "Invalid hostlist" and still exits 0,
# so an empty answer must stop the job here instead of falling back to localhost.
if ! CLUSTERDDP_HOSTS="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"; then
    echo "clusterddp: 'scontrol show hostnames' failed for SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST" >&2
    exit 1
fi
MASTER_ADDR="${CLUSTERDDP_HOSTS%%$'\n'*}"
if [ -z "$MASTER_ADDR" ]; then
    echo "clusterddp: no host found in SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST; refusing to guess MASTER_ADDR" >&2
    exit 1
fi
export MASTER_ADDR

# MASTER_PORT: from the job id, outside Linux's ephemeral range (32768-60999), so that jobs with
# nearby ids never collide; checked free below, with a fallback that every node then uses.
MASTER_PORT=$(( 20000 + 10#$SLURM_JOB_ID % 10000 ))
CLUSTERDDP_PORT_MODE=fallback
# This batch shell runs on the first node, where the rendezvous will listen.
MASTER_PORT="$(python3 - "$MASTER_PORT" "$CLUSTERDDP_PORT_MODE" 20000 10000 <<'CLUSTERDDP_PY'
import socket, sys
port, mode, base, span = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
candidates = [port] if mode == "strict" else [base + (port - base + i) % span for i in range(span)]
for p in candidates:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    sys.exit(0)
sys.exit("clusterddp: MASTER_PORT %d is already in use on %s; choose another --master-port" % (port, socket.gethostname()))
CLUSTERDDP_PY
)"
export MASTER_PORT

RUN_DIR=clusterddp-runs/train-"$SLURM_JOB_ID"
mkdir -p -- "$RUN_DIR"
# The run directory is the job's own: not a link, this user's, writable by nobody else. (In a directory others can
# write, the ranks would write through links planted there and read planted reports back.)
if [ -L "$RUN_DIR" ] || [ "$(stat -c %u -- "$RUN_DIR")" != "$(id -u)" ] || [ -n "$(find "$RUN_DIR" -maxdepth 0 -perm /022)" ]; then
    echo "clusterddp: the run directory $RUN_DIR is not this job's own (a link, another user's, or writable by group or others): refusing to use it" >&2
    exit 1
fi
export CLUSTERDDP_RUN_DIR="$RUN_DIR"
# NCCL: PyTorch's flight recorder keeps every rank's last collectives and writes them here when one times out
# (or the hang watchdog ends the job); a failed collective aborts the job instead of hanging it.
# (--no-flight-recorder leaves these out; a value given with -e is kept.)
export TORCH_NCCL_TRACE_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$RUN_DIR/nccl-trace/rank_"
export TORCH_NCCL_ASYNC_ERROR_HANDLING=3
mkdir -p -- "$RUN_DIR/nccl-trace"
# (srun reads % in --output as a file-name pattern: the directory part is escaped where it is used.)
echo "clusterddp: job $SLURM_JOB_ID (restart count $CLUSTERDDP_RESTARTS) on $SLURM_JOB_NODELIST: world size 8 (2 x 4), MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
echo "clusterddp: per-node (rank-prefixed) and per-rank logs in $RUN_DIR"

# One torchrun agent per node; the agents meet at a c10d rendezvous on MASTER_ADDR:MASTER_PORT.
srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 --container-image='nvcr.io#nvidia/pytorch:24.05-py3' --container-mounts="$PWD" --container-workdir="$PWD" \
    --output="${RUN_DIR//%/%%}/node-%n.out" \
    torchrun --nnodes=2 --nproc-per-node=4 \
    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
    --tee=3 --log-dir="$RUN_DIR/torchrun" \
    train.py &
CLUSTERDDP_SRUN_PID=$!

# srun runs in the background so that signal traps (time limits, preemption) fire without waiting for it;
# a trap interrupts `wait`, so wait again while srun is still there.
CLUSTERDDP_STATUS=0
wait "$CLUSTERDDP_SRUN_PID" || CLUSTERDDP_STATUS=$?
while kill -0 "$CLUSTERDDP_SRUN_PID" 2>/dev/null; do
    CLUSTERDDP_STATUS=0
    wait "$CLUSTERDDP_SRUN_PID" || CLUSTERDDP_STATUS=$?
done
# What the ranks' control thread found (clusterddp.runtime): a hang's roll call, or ranks that never arrived.
# Only for a step that failed: the ranks' exit status decides, a file in the run directory only explains it.
if [ "$CLUSTERDDP_STATUS" -eq 0 ]; then
    :
elif [ -f "$RUN_DIR/stacks/hang-$CLUSTERDDP_RESTARTS/rollcall.txt" ]; then
    echo "clusterddp: the hang watchdog ended the job: no rank advanced for $CLUSTERDDP_HANG_TIMEOUT s. Roll call:" >&2
    cat -- "$RUN_DIR/stacks/hang-$CLUSTERDDP_RESTARTS/rollcall.txt" >&2
    echo "clusterddp: every rank's stacks: $RUN_DIR/stacks/hang-$CLUSTERDDP_RESTARTS/" >&2
    CLUSTERDDP_STATUS=79
elif [ -f "$RUN_DIR/stacks/rendezvous-$CLUSTERDDP_RESTARTS.txt" ]; then
    echo "clusterddp: $(cat -- "$RUN_DIR/stacks/rendezvous-$CLUSTERDDP_RESTARTS.txt")" >&2
    CLUSTERDDP_STATUS=78
fi
if [ "$CLUSTERDDP_STATUS" -ne 0 ]; then
    echo "clusterddp: job step failed with exit code $CLUSTERDDP_STATUS; see the logs in $RUN_DIR" >&2
fi
exit "$CLUSTERDDP_STATUS"
