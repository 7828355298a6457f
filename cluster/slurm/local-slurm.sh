#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for testing the SLURM path (cluster/slurm/local-test.sh,
# tests/cluster/test_slurm.py). Needs root and Debian's packages slurm-wlm, slurmdbd, munge and
# mariadb-server (`install` puts them in with apt-get).
#
#   local-slurm.sh install        apt-get install the packages that are missing
#   local-slurm.sh start DIR      start every daemon with its files in DIR (a new, empty directory)
#   local-slurm.sh stop DIR       stop the daemons started in DIR (any that still run); DIR stays
#
# Everything lives in DIR, nothing in /etc: its own munge key and socket, a MariaDB instance
# (datadir, socket, a free loopback port, a password made here), slurmdbd, slurmctld and slurmd
# on free loopback ports, and DIR/slurm.conf, which clients find through SLURM_CONF=DIR/slurm.conf
# (`start` prints that line). The node is this machine with its real CPUs and memory (`slurmd -C`),
# SelectType=select/cons_tres with cores and memory as consumable resources, one partition `local`
# (each core shared by up to two jobs: OverSubscribe=FORCE:2).
#
# Decision (accounting): `sacct` reads the accounting database only (slurmdbd); jobcomp/filetxt
# writes a file sacct cannot read, and accounting_storage/filetxt is gone from Slurm 22.05. The
# tests must show job states from sacct (COMPLETED, CANCELLED, TIMEOUT), so the cluster runs
# slurmdbd on a MariaDB of its own: about 10 s more at start, one more package to install.
set -euo pipefail

PACKAGES=(slurm-wlm slurmdbd slurm-client munge mariadb-server)

die() { echo "local-slurm: $*" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Wait up to $1 seconds for the command that follows to succeed (polling: the daemons give no
# other signal that they are ready).
wait_for() {
    local seconds=$1; shift
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

missing_packages() {
    local missing=()
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null || missing+=(slurm-wlm)
    command -v sbatch >/dev/null && command -v sacct >/dev/null || missing+=(slurm-client)
    command -v slurmdbd >/dev/null || missing+=(slurmdbd)
    command -v munged >/dev/null || missing+=(munge)
    command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null || missing+=(mariadb-server)
    echo "${missing[*]}"
}

install() {
    local missing
    missing=$(missing_packages)
    [[ -z "$missing" ]] && return 0
    [[ $(id -u) -eq 0 ]] || die "the packages $missing are missing; install them as root (apt-get install $missing)"
    command -v apt-get >/dev/null || die "the packages $missing are missing and there is no apt-get to install them"
    echo "local-slurm: installing $missing" >&2
    apt-get update -qq >/dev/null
    # The packages' own services (the system's munged, MariaDB on port 3306, slurmctld, slurmd)
    # must not start: `start` runs daemons of its own, and nothing may be left running. Debian's
    # way: a policy-rc.d that refuses every start, for the time of the install (unless the
    # machine has one already, as containers do).
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && made_policy=1
    fi
    local status=0
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null || status=$?
    [[ $made_policy -eq 1 ]] && rm -f "$policy"
    [[ $status -eq 0 ]] || die "apt-get install $missing failed (exit code $status)"
    missing=$(missing_packages)
    [[ -z "$missing" ]] || die "apt-get did not install $missing"
}

start() {
    local dir=$1
    [[ $(id -u) -eq 0 ]] || die "start needs root (slurmd runs jobs as their users)"
    [[ -z "$(missing_packages)" ]] || die "missing packages: $(missing_packages) (local-slurm.sh install)"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    chmod 0700 "$dir"
    mkdir -p "$dir"/{state,spool,log,mysql,run}
    local host cpus_line memory db_port dbd_port ctld_port slurmd_port password
    host=$(hostname -s)
    # the node's real layout: CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=...
    cpus_line=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //')
    [[ "$cpus_line" == CPUs=* ]] || die "slurmd -C did not describe this node: $cpus_line"
    memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$cpus_line")
    # leave the system some memory: jobs may ask up to 90% of it
    cpus_line=$(sed "s/RealMemory=[0-9]*/RealMemory=$((memory * 9 / 10))/" <<<"$cpus_line")
    db_port=$(free_port) dbd_port=$(free_port) ctld_port=$(free_port) slurmd_port=$(free_port)
    password=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')

    # munge: this cluster's own key and socket
    (umask 077 && head -c 1024 /dev/urandom >"$dir/munge.key")
    munged --force --key-file="$dir/munge.key" --socket="$dir/run/munge.socket" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/run/munged.seed"
    wait_for 20 test -S "$dir/run/munge.socket" || die "munged did not start; see $dir/log/munged.log"

    # MariaDB for slurmdbd: loopback, a free port, root only through the socket (as root)
    mariadb-install-db --datadir="$dir/mysql" --user=root --auth-root-authentication-method=socket \
        --skip-test-db >"$dir/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $dir/log/mariadb-install.log"
    mariadbd --no-defaults --datadir="$dir/mysql" --user=root --socket="$dir/run/mysql.sock" \
        --pid-file="$dir/run/mariadbd.pid" --bind-address=127.0.0.1 --port="$db_port" \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=48M --log-error="$dir/log/mariadb.log" >>"$dir/log/mariadb.log" 2>&1 &
    wait_for 60 mariadb --no-defaults --socket="$dir/run/mysql.sock" -uroot -e 'SELECT 1' \
        || die "mariadbd did not start; see $dir/log/mariadb.log"
    mariadb --no-defaults --socket="$dir/run/mysql.sock" -uroot -e \
        "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$password';
         GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"

    (umask 077 && cat >"$dir/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$dir/run/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
PidFile=$dir/run/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=$password
StorageLoc=slurm_acct_db
EOF
)
    cat >"$dir/slurm.conf" <<EOF
# one-node test cluster made by cluster/slurm/local-slurm.sh
ClusterName=distfit-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$dir/run/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# accounting: sacct reads slurmdbd (see the decision at the top of cluster/slurm/local-slurm.sh)
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
# the munge socket clients use towards slurmdbd (AuthInfo covers the rest; slurm.conf(5))
AccountingStoragePass=$dir/run/munge.socket
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
# a test cluster: jobs start and end promptly, a killed job's processes are gone 5 s after SIGTERM
ReturnToService=2
KillWait=5
MinJobAge=60
SchedulerParameters=sched_interval=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 $cpus_line State=UNKNOWN
# two jobs may share a core: the tests keep a job waiting (idle) for its time limit while
# others run; a job still gets no more cores than the node has
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2
EOF
    chmod 0644 "$dir/slurm.conf"
    export SLURM_CONF="$dir/slurm.conf"

    slurmdbd   # reads slurmdbd.conf beside $SLURM_CONF
    wait_for 60 sacctmgr -n list cluster || die "slurmdbd did not answer; see $dir/log/slurmdbd.log"
    sacctmgr -i add cluster distfit-local >/dev/null 2>&1 || true   # slurmctld registers it too
    slurmctld -f "$dir/slurm.conf"
    wait_for 60 scontrol ping || die "slurmctld did not start; see $dir/log/slurmctld.log"
    slurmd -f "$dir/slurm.conf"
    # the node idle: slurmd registered and the controller took it into service
    wait_for 90 bash -c '[[ "$(sinfo -h -N -o %t)" == idle ]]' \
        || die "the node did not become idle ($(sinfo -h -N -o %t 2>&1)); see $dir/log/slurmd.log"
    echo "SLURM_CONF=$dir/slurm.conf"
}

stop() {
    local dir=$1
    # the SLURM daemons together (slurmd ends its jobs' steps first), then the database, then munge
    stop_daemons "$dir" slurmd slurmctld slurmdbd
    stop_daemons "$dir" mariadbd
    stop_daemons "$dir" munged
    # job processes slurmd started and left behind (a job step killed with its daemon)
    pkill_session_leftovers "$dir"
}

# SIGTERM to each named daemon of DIR, 30 s for all of them to end, then SIGKILL.
stop_daemons() {
    local dir=$1 name pidfile pid pids=()
    shift
    for name in "$@"; do
        pidfile="$dir/run/$name.pid"
        [[ -s "$pidfile" ]] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null && pids+=("$pid")
    done
    for pid in "${pids[@]}"; do
        wait_for 30 bash -c "! kill -0 $pid" || kill -9 "$pid" 2>/dev/null || true
    done
}

# Job processes that outlived slurmd: their environment has a SLURM_JOB_ID and names this
# cluster's SLURM_CONF (the submitter's, exported to the job).
pkill_session_leftovers() {
    local dir=$1 pid
    for pid in $(grep -lsz "^SLURM_CONF=$dir/slurm.conf$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
        [[ "$pid" == "$$" ]] && continue
        grep -qsz "^SLURM_JOB_ID=" "/proc/$pid/environ" || continue
        kill -9 "$pid" 2>/dev/null || true
    done
}

case "${1:-}" in
    install) install ;;
    start) [[ -n "${2:-}" ]] || die "usage: local-slurm.sh start DIR"; start "$2" ;;
    stop) [[ -n "${2:-}" ]] || die "usage: local-slurm.sh stop DIR"; stop "$2" ;;
    *) die "usage: local-slurm.sh install | start DIR | stop DIR" ;;
esac
