#!/bin/bash
#SBATCH --ignore-pbs
#SBATCH --job-name=train
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:2
#SBATCH --time=30
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=clusterddp-runs/train-%j.out
#SBATCH --mail-type=END
#SBATCH --no-kill
#
# Rendered by clusterddp <version>: 4 node(s) x 2 rank(s) per node = world size 8
# launcher: torchrun, backend: nccl. Regenerate rather than edit: clusterddp render --help
# retries after a node fault: 2; each attempt runs on 4 node(s) of the allocation; 0 spare(s)
set -euo pipefail
CLUSTERDDP_BEGAN="$(date +%s.%N)"  # (the goodput ledger: where this allocation's node-seconds begin)

# Set here, not inherited: a stop file (or a drill's variables) from the submitting shell would stop these ranks.
unset CLUSTERDDP_STOP_FILE CLUSTERDDP_DRILL_DIR CLUSTERDDP_DRILL_STOP_AT
export PYTHONUNBUFFERED=1
export CLUSTERDDP_LAUNCHER=torchrun
export CLUSTERDDP_NNODES=4
export CLUSTERDDP_GPUS_PER_NODE=2
export CLUSTERDDP_PROCS_PER_NODE=2
export CLUSTERDDP_WORLD_SIZE=8
export CLUSTERDDP_HANG_TIMEOUT=900
export OMP_NUM_THREADS=1
export NCCL_DEBUG=INFO
# --setup lines, verbatim (they are shell code by design)
module load cuda/12
source ~/venv/bin/activate

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

MASTER_PORT=29400
CLUSTERDDP_PORT_MODE=strict
# The port check, also run on another node when a retry's rendezvous moves there (base.sh.j2).
CLUSTERDDP_PORT_PY='
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
'
# This batch shell runs on the first node, where the rendezvous will listen.
CLUSTERDDP_HEAD="$MASTER_ADDR"
MASTER_PORT="$(python3 -c "$CLUSTERDDP_PORT_PY" "$MASTER_PORT" "$CLUSTERDDP_PORT_MODE" 20000 10000)"
export MASTER_PORT

RUN_DIR=clusterddp-runs/train-"$SLURM_JOB_ID"
export CLUSTERDDP_RUN_DIR="$RUN_DIR"
CLUSTERDDP_ATTEMPT=0 CLUSTERDDP_BAD="" CLUSTERDDP_STATUS=1
clusterddp_next() {  # PHASE [OPTION...]: the supervisor's answer in CLUSTERDDP_DO, _STEP_NODES, _BAD and _STATUS
    local out
    out="$(python3 -m clusterddp.healing next "$@" --run-dir "$RUN_DIR" \
        --hosts "${CLUSTERDDP_HOSTS//$'\n'/,}" --bad "$CLUSTERDDP_BAD" --restart "$CLUSTERDDP_RESTARTS" \
        --attempt "$CLUSTERDDP_ATTEMPT" --partition "${SLURM_JOB_PARTITION:-}" --nodes 4 --per-node 2 --retries 2 --max-requeues 3 --launcher torchrun --requeues)" || {
        echo "clusterddp: the supervisor (python -m clusterddp.healing next $1) failed where the batch script runs: the job ends here, nothing is retried; its logs are in $RUN_DIR" >&2
        out=$'end\n\n\n'"$CLUSTERDDP_STATUS"
    }
    { IFS= read -r CLUSTERDDP_DO; IFS= read -r CLUSTERDDP_STEP_NODES; IFS= read -r CLUSTERDDP_BAD; IFS= read -r CLUSTERDDP_STATUS; } <<<"$out" || true
    case "$CLUSTERDDP_STATUS" in ''|*[!0-9]*) CLUSTERDDP_STATUS=1 ;; esac
}
# The run directory, before anything is written there: the job's own (healing/__main__.py), else the job ends here.
clusterddp_next start --began "$CLUSTERDDP_BEGAN"
[ "$CLUSTERDDP_DO" != end ] || exit "$CLUSTERDDP_STATUS"
trap 'printf "end\t%s\t%s\n" "$CLUSTERDDP_RESTARTS" "$(date +%s.%N)" >>"$RUN_DIR/allocations.tsv" 2>/dev/null || :' EXIT
# NCCL: PyTorch's flight recorder keeps every rank's last collectives and writes them here when one times out
# (or the hang watchdog ends the job); a failed collective aborts the job instead of hanging it.
# (--no-flight-recorder leaves these out; a value given with -e is kept.)
export TORCH_NCCL_TRACE_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$RUN_DIR/nccl-trace/rank_"
export TORCH_NCCL_ASYNC_ERROR_HANDLING=3
mkdir -p -- "$RUN_DIR/nccl-trace"
# (srun reads % in --output as a file-name pattern: the directory part is escaped where it is used.)
echo "clusterddp: job $SLURM_JOB_ID (restart count $CLUSTERDDP_RESTARTS) on $SLURM_JOB_NODELIST: world size 8 (4 x 2), MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
echo "clusterddp: per-node (rank-prefixed) and per-rank logs in $RUN_DIR"

# Time limit and preemption: Slurm signals this shell 120 s before the limit (USR2); bash runs a trap only once
# its foreground child is done (hence srun in the background); the ranks see $CLUSTERDDP_STOP_FILE (should_stop()).
export CLUSTERDDP_STOP_FILE="$RUN_DIR/stop-requested-$CLUSTERDDP_RESTARTS"
CLUSTERDDP_SIGNAL="" CLUSTERDDP_TIMER_PID="" CLUSTERDDP_SRUN_PID=""
clusterddp_stop() {
    [ -z "$CLUSTERDDP_SIGNAL" ] || return 0
    CLUSTERDDP_SIGNAL="$1"
    echo "clusterddp: SIG$1 received (restart count $CLUSTERDDP_RESTARTS): every rank checkpoints and stops; srun is ended after 90 s"
    touch -- "$CLUSTERDDP_STOP_FILE"
    clusterddp_timer
}
clusterddp_timer() {  # srun ends --stop-grace after the request (one that came before srun started: after its start)
    [ -n "$CLUSTERDDP_SIGNAL" ] && [ -n "$CLUSTERDDP_SRUN_PID" ] && [ -z "$CLUSTERDDP_TIMER_PID" ] || return 0
    ( sleep 90; kill -TERM "$CLUSTERDDP_SRUN_PID" 2>/dev/null ) &
    CLUSTERDDP_TIMER_PID=$!
}
trap 'clusterddp_stop USR2' USR2
trap 'clusterddp_stop TERM' TERM
clusterddp_requeue() {  # [NODES]: without these nodes (after a node fault); the supervisor checked the limits
    command -v scontrol >/dev/null 2>&1 || { echo "clusterddp: scontrol is not available where this job runs (a container?): cannot requeue; the last checkpoint is kept" >&2; exit 76; }
    local target="$SLURM_JOB_ID"  # an array task is requeued alone, not the whole array
    [[ "${SLURM_ARRAY_JOB_ID:-}_${SLURM_ARRAY_TASK_ID:-}" =~ ^[0-9]+_[0-9]+$ ]] && target="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
    echo "clusterddp: requeueing job $target${1:+ without $1} (requeue $((10#$CLUSTERDDP_RESTARTS + 1)) of 3)"
    trap - USR2 TERM
    local update=(ExcNodeList="${1:-}" NumNodes=4-4)
    [ -n "${1:-}" ] || { scontrol requeue "$target"; exit 0; }
    # Slurm changes a job only while pending; requeuehold sends SIGTERM at once: live on (KillWait) to update.
    trap '' TERM
    scontrol requeuehold "$target"
    scontrol update JobId="$target" "${update[@]}" || echo "clusterddp: could not update the requeued job: ${update[*]}" >&2
    scontrol release "$target"
    exit 0
}

# Attempts: the supervisor (clusterddp/healing/supervise.py) decides what comes next (gate, run, requeue, end; why:
# this log, $RUN_DIR/attempts.tsv); this shell carries it out (2 retries at most, 0 spare(s)).
CLUSTERDDP_SIGNAL="${CLUSTERDDP_SIGNAL:-}"
clusterddp_gate() {
    # The health gate (healing/gate.py): a node whose check fails or says nothing within 120 s gets no rank.
    local dir="$RUN_DIR/health/$CLUSTERDDP_RESTARTS.$CLUSTERDDP_ATTEMPT" n
    mkdir -p -- "$dir"
    n=$(( $(tr -cd , <<<"$CLUSTERDDP_STEP_NODES" | wc -c) + 1 ))
    timeout 120 srun --nodes="$n" --ntasks="$n" --ntasks-per-node=1 --nodelist="$CLUSTERDDP_STEP_NODES" --kill-on-bad-exit=0 \
        --output="${dir//%/%%}/%N.out" python3 -m clusterddp.healing gate "$dir" '' >/dev/null 2>"$dir/srun.err" || true
}
clusterddp_room() {  # the job's partition, for the supervisor's check that a requeue without a node still fits
    sinfo --noheader --Node --partition="${SLURM_JOB_PARTITION:-}" --format='%N %t' >"$RUN_DIR/health/sinfo.txt" 2>/dev/null || : >"$RUN_DIR/health/sinfo.txt"
}

while :; do
    case "$CLUSTERDDP_DO" in
        run) ;;
        gate) clusterddp_gate; clusterddp_room; clusterddp_next gated; continue ;;
        requeue) clusterddp_requeue "$CLUSTERDDP_STEP_NODES" ;;
        *) break ;;
    esac
    if [ "$CLUSTERDDP_ATTEMPT" -gt 0 ] || [ "${CLUSTERDDP_STEP_NODES%%,*}" != "$MASTER_ADDR" ]; then
        # The rendezvous moves with the nodes: a new port (a lost rank may hold the old), checked free where it listens.
        # (At the first attempt too, where the health gate left the first host out: rank 0 runs on the step's first.)
        MASTER_ADDR="${CLUSTERDDP_STEP_NODES%%,*}"
        CLUSTERDDP_ON=()
        [ "$MASTER_ADDR" = "$CLUSTERDDP_HEAD" ] || CLUSTERDDP_ON=(srun --nodes=1 --ntasks=1 --nodelist="$MASTER_ADDR")
        MASTER_PORT="$("${CLUSTERDDP_ON[@]}" python3 -c "$CLUSTERDDP_PORT_PY" "$MASTER_PORT" "$CLUSTERDDP_PORT_MODE" 20000 10000)"
    fi
    [ "$CLUSTERDDP_ATTEMPT" -eq 0 ] || echo "clusterddp: attempt $((CLUSTERDDP_ATTEMPT + 1)) on $CLUSTERDDP_STEP_NODES: MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
    CLUSTERDDP_START="$(date +%s)"
    # srun's own messages of this attempt also go to a file of their own, for its fault report.
    CLUSTERDDP_STEP_ERR="$RUN_DIR/srun-$CLUSTERDDP_RESTARTS.$CLUSTERDDP_ATTEMPT.err"
    exec {CLUSTERDDP_ERR_FD}>&2 2> >(tee -a -- "$CLUSTERDDP_STEP_ERR" >&2)
    CLUSTERDDP_TEE_PID=$!
# One torchrun agent per node, at a static rendezvous: node rank = SLURM_NODEID, set inside each task (single
# quotes: expanded per task; torchrun reads PET_NODE_RANK as --node-rank); node 0's agent holds the store on
# MASTER_ADDR:MASTER_PORT. (c10d's rendezvous polls its store once a second until every agent has joined.)
# The agent is torchrun (torch.distributed.run) in the python the ranks run in, as clusterddp.runtime.agent: it
# waits for node 0's store by polling, node 0's agent leaves torch's exit barrier last, it ends without the
# teardown (torchrun itself where that python has no torch); in a container, the image's torchrun.
srun --nodes=4 --ntasks=4 --nodelist="$CLUSTERDDP_STEP_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 --open-mode=append \
    --output="${RUN_DIR//%/%%}/node-%n.out" \
    bash --norc -c 'export PET_NODE_RANK="$SLURM_NODEID"; exec "$@"' clusterddp-agent \
    python3 -m clusterddp.runtime.agent --nnodes=4 --nproc-per-node=2 \
    --rdzv-backend=static --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
    --tee=3 --log-dir="$RUN_DIR/torchrun" \
    -m mypkg.train &
CLUSTERDDP_SRUN_PID=$!
    exec 2>&"$CLUSTERDDP_ERR_FD" {CLUSTERDDP_ERR_FD}>&-
    clusterddp_timer

    # srun runs in the background so that traps fire at once; a trap interrupts `wait`: wait again while srun is there.
    while CLUSTERDDP_STATUS=0; wait "$CLUSTERDDP_SRUN_PID" || CLUSTERDDP_STATUS=$?; kill -0 "$CLUSTERDDP_SRUN_PID" 2>/dev/null; do :; done
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$CLUSTERDDP_TEE_PID" 2>/dev/null && sleep 0.1 || break; done  # tee has srun's last lines
    [ -z "$CLUSTERDDP_TIMER_PID" ] || kill "$CLUSTERDDP_TIMER_PID" 2>/dev/null || true
    CLUSTERDDP_TIMER_PID="" CLUSTERDDP_SRUN_PID=""
    [ "$CLUSTERDDP_STATUS" -eq 0 ] || clusterddp_room
    clusterddp_next ended --status "$CLUSTERDDP_STATUS" --signal "$CLUSTERDDP_SIGNAL" --start "$CLUSTERDDP_START" \
        --ran-on "$CLUSTERDDP_STEP_NODES"
    case "$CLUSTERDDP_DO" in gate|run) CLUSTERDDP_ATTEMPT=$((CLUSTERDDP_ATTEMPT + 1)) ;; esac
done
[ "$CLUSTERDDP_STATUS" -eq 0 ] || echo "clusterddp: job step failed with exit code $CLUSTERDDP_STATUS; see the logs in $RUN_DIR" >&2
exit "$CLUSTERDDP_STATUS"
