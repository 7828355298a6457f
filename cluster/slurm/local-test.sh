#!/usr/bin/env bash
# Try the SLURM path on this machine, end to end (docs/deployment.md, "Trying the SLURM path"):
#
#   bash cluster/slurm/local-test.sh            # as root, in the environment distfit is installed in
#                                               # with its test extra: pip install -e ".[test]"
#
# 1. installs what is missing (apt-get: slurm-wlm, slurmdbd, munge, mariadb-server);
# 2. starts a one-node SLURM in a new temporary directory (cluster/slurm/local-slurm.sh: munge,
#    MariaDB + slurmdbd so that sacct works, slurmctld, slurmd with this machine's real CPUs
#    and memory, select/cons_tres, one partition) and waits until sinfo shows the node idle;
# 3. runs tests/cluster/test_slurm.py against it: the PL94 pipeline's plan and a seeded release
#    through cluster/slurm/distfit-run.sbatch (sbatch), a release through cluster/jobqueue_run.py
#    (dask-jobqueue SLURMCluster, a worker job per worker) with one worker job scancelled
#    mid-release, a job that runs out of time resumed by a second job, worker jobs that never
#    start; every plan and release compared, checksums and arrays, with the same spec, data and
#    seed outside SLURM, every job's end read from sacct;
# 4. stops every daemon it started (also on failure or Ctrl-C) and removes the directory.
#
# Exit code: the tests' (0: all passed), or 1 when a daemon outlived the stop. Arguments are
# passed to pytest (e.g. -k batch_script). About 3 minutes on 2 cores, once installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}

bash cluster/slurm/local-slurm.sh install
if ! "$PYTHON" -c "import distfit, dask_jobqueue, pytest" 2>/dev/null; then
    echo "local-test: $PYTHON cannot import distfit, dask_jobqueue and pytest; activate the environment distfit is installed in (pip install -e \".[test]\")" >&2
    exit 2
fi

dir=$(mktemp -d /tmp/distfit-slurm.XXXXXX)
stopped=0
stop() {
    [[ $stopped -eq 1 ]] && return 0
    stopped=1
    bash cluster/slurm/local-slurm.sh stop "$dir" || true
    local left
    left=$(for f in "$dir"/run/*.pid; do [[ -s "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null && basename "$f" .pid; done || true)
    if [[ -n "$left" ]]; then
        echo "local-test: still running after the stop: $left (pid files in $dir/run)" >&2
        return 1
    fi
    rm -rf "$dir"
}
trap 'stop || exit 1' EXIT
trap 'exit 130' INT TERM

bash cluster/slurm/local-slurm.sh start "$dir"
export SLURM_CONF="$dir/slurm.conf"
sinfo
status=0
DISTFIT_SLURM_CONF="$dir/slurm.conf" "$PYTHON" -m pytest -q -p no:cacheprovider tests/cluster/test_slurm.py "$@" || status=$?
stop || exit 1
if [[ $status -eq 0 ]]; then
    echo "local-test: the SLURM path works; every daemon stopped"
fi
exit "$status"
