#!/usr/bin/env bash
# A real Slurm cluster on this machine for the test suite: one node on localhost,
# and optionally N more, each in namespaces of its own (nodes.sh).
#
#   cluster.sh install            apt-get install slurm-wlm, slurmdbd, munge,
#                                 mariadb-server and iproute2 if any is missing (idempotent;
#                                 the only command that installs anything: the tests never
#                                 run it unless SWEEP_TESTS_INSTALL_SLURM=1)
#   cluster.sh missing            print the packages of that list not installed, one a line
#   cluster.sh start  STATE_DIR [N]
#                                 write configs under STATE_DIR, start munged,
#                                 mariadbd, slurmdbd, slurmctld and slurmd, wait
#                                 until the node is idle and sacct answers, then
#                                 print "SLURM_CONF=STATE_DIR/slurm.conf" on stdout.
#                                 With N >= 2: also nodes mn1..mnN, each with its
#                                 own hostname, loopback and /etc/hosts, in
#                                 partition "multi"; stdout then has
#                                 "MULTI_PARTITION=multi" and "MULTI_NODES=mn1,...",
#                                 or "MULTI_UNAVAILABLE=<why>" where they cannot be
#                                 had (the localhost node still serves)
#   cluster.sh stop   STATE_DIR   cancel the cluster's jobs, then stop exactly the
#                                 daemons that `start` recorded (TERM, then KILL)
#   cluster.sh status STATE_DIR   show the recorded daemons and the node state
#   cluster.sh stop-stale         stop every cluster whose owner has ended (below); `start`
#                                 does this first
#
# With SLURM_TEST_OWNER_PID set (the tests set it to the pytest process that runs the session),
# `start` records that process as the cluster's owner and registers STATE_DIR under
# $SLURM_TEST_REGISTRY (default /tmp/sweep-slurm-clusters). A registered cluster whose owner
# is gone was left by a run killed outright (SIGKILL, a lost machine): the next `start` on the
# machine, or `stop-stale`, stops it. A cluster of a run still going, or one started by hand
# (no owner), is never touched.
#
# Everything (configs, munge key, MariaDB datadir and socket, Slurm state,
# spool, logs, pid files, the record of started PIDs) lives under STATE_DIR,
# except munged's socket, which must be the standard /run/munge/munge.socket.2
# (Slurm's accounting clients ignore AuthInfo=socket=). A munged already serving
# that socket is used as it is. Every TCP port is picked free at start; all
# traffic goes to 127.0.0.1 (MariaDB listens only there), or with N nodes, to
# the host's address on their bridge too (a private /24 with no uplink: nodes.sh).
# /etc/slurm and /etc/munge are never read or written. Progress goes to stderr; stdout of
# `start` is the SLURM_CONF=... line (and the MULTI_... lines with N). Needs root; no systemd.
#
# Tunables (environment): SLURM_TEST_CLUSTER (cluster name, default "sweeptest"),
# SLURM_TEST_START_TIMEOUT (seconds to wait for the cluster, default 90).

set -euo pipefail

readonly PROG=${0##*/}
# iproute2: `ip`, for the extra nodes' bridge and veth pairs (nodes.sh); unshare and nsenter are util-linux's (essential).
readonly PACKAGES=(slurm-wlm slurmdbd munge mariadb-server iproute2)
readonly PARTITION=debug
readonly MULTI_PARTITION=multi
readonly CLUSTER=${SLURM_TEST_CLUSTER:-sweeptest}
readonly START_TIMEOUT=${SLURM_TEST_START_TIMEOUT:-90}
readonly STOP_TIMEOUT=20 # per daemon, before SIGKILL
# Unix sockets (munge, MariaDB, slurmstepd) must fit in sun_path (108 bytes).
readonly MAX_STATE_DIR_LEN=70
readonly REGISTRY=${SLURM_TEST_REGISTRY:-${TMPDIR:-/tmp}/sweep-slurm-clusters}

export PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# shellcheck source=nodes.sh
source "$(dirname "${BASH_SOURCE[0]}")/nodes.sh"

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$PROG" "$*" >&2; exit 1; }

# die_log MESSAGE LOG: fail with one line naming LOG, then the tail of LOG, or
# of LOG's sibling .stderr file when there is one (Slurm daemons under -D copy
# their log there, along with errors from before the log is open).
die_log() {
  local msg=$1 log=$2 tail_of=$2
  [[ -s ${log%.log}.stderr ]] && tail_of=${log%.log}.stderr
  printf '%s: ERROR: %s; read %s (last lines of %s below)\n' "$PROG" "$msg" "$log" "${tail_of##*/}" >&2
  if [[ -s $tail_of ]]; then tail -n 25 "$tail_of" | sed 's/^/    | /' >&2; else echo "    | (empty or missing)" >&2; fi
  exit 1
}

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root (uid is $(id -u))"; }

# --------------------------------------------------------------------- install

missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}

cmd_missing() {
  command -v dpkg-query >/dev/null || die "dpkg-query not found: only Debian/Ubuntu hosts are supported"
  missing_packages
}

cmd_install() {
  command -v dpkg-query >/dev/null || die "dpkg-query not found: only Debian/Ubuntu hosts are supported"
  local missing
  mapfile -t missing < <(missing_packages)
  if (( ${#missing[@]} == 0 )); then
    say "packages already installed: ${PACKAGES[*]}"
    return 0
  fi
  need_root
  command -v apt-get >/dev/null || die "apt-get not found; cannot install ${missing[*]}"
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  # Package scripts must not start the system's munge/mariadb/slurm services:
  # the tests run their own. policy-rc.d exit 101 = "action forbidden".
  local policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
    trap 'rm -f "'"$policy"'"' EXIT
  fi
  local apt=(apt-get -q -o DPkg::Lock::Timeout=300
             -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  "${apt[@]}" update >&2 || die "apt-get update failed"
  "${apt[@]}" install -y --no-install-recommends "${PACKAGES[@]}" </dev/null >&2 \
    || die "apt-get install ${PACKAGES[*]} failed"
  mapfile -t missing < <(missing_packages)
  (( ${#missing[@]} == 0 )) || die "still missing after apt-get install: ${missing[*]}"
  say "installed ${PACKAGES[*]}"
}

# ----------------------------------------------------------------- helpers

# Field 22 of /proc/PID/stat: start time in clock ticks since boot. Together with
# the PID it identifies a process, so `stop` never signals a recycled PID.
proc_start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) } # drop "pid (comm) ", comm may contain spaces
  # shellcheck disable=SC2086 # split the fields on purpose
  set -- $stat
  echo "${20}"
}

# alive PID STARTTIME: the recorded process is still running (zombies count as gone).
alive() {
  local st
  st=$(proc_start_time "$1") || return 1
  [[ $st == "$2" ]] && running "$1"
}

# pick_port VAR: set VAR to a TCP port that nothing on this host is bound to (any
# state, IPv4 or IPv6) and that no earlier pick_port call returned.
declare -a TAKEN_PORTS=()
pick_port() {
  local port hex tries
  for (( tries = 0; tries < 200; tries++ )); do
    port=$(( 20000 + RANDOM % 30000 ))
    [[ " ${TAKEN_PORTS[*]-} " == *" $port "* ]] && continue
    hex=$(printf ':%04X' "$port")
    if ! awk -v h="$hex" 'FNR > 1 && substr($2, length($2) - 4) == h { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      TAKEN_PORTS+=("$port")
      printf -v "$1" '%s' "$port"
      return 0
    fi
  done
  die "no free TCP port found"
}

# running PID: the process exists and is not a zombie.
running() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

# start_daemon NAME LOG CMD...: run CMD in the foreground of its own session, in
# the background of this script; record "NAME PID STARTTIME" in $PIDS_FILE.
start_daemon() {
  local name=$1 log=$2 pid st
  shift 2
  say "starting $name"
  # setsid does not fork here (a background child of a shell without job control
  # is not a process-group leader), so $! is the daemon's own PID.
  setsid "$@" </dev/null >>"$log" 2>&1 &
  pid=$!
  st=$(proc_start_time "$pid") || die_log "$name exited immediately" "$log"
  echo "$name $pid $st" >>"$PIDS_FILE"
  LAST_PID=$pid
}

# wait_for NAME PID LOG CHECK...: poll CHECK until it succeeds; fail fast with
# the log's tail if the daemon dies, or after the remaining start budget.
wait_for() {
  local name=$1 pid=$2 log=$3
  shift 3
  until "$@" >/dev/null 2>&1; do
    running "$pid" || die_log "$name (pid $pid) exited during startup" "$log"
    (( SECONDS < DEADLINE )) || die_log "$name not ready within ${START_TIMEOUT}s (waiting for: $*)" "$log"
    sleep 0.2
  done
}

set_state_dir() {
  [[ -n ${1-} ]] || die "usage: $PROG ${CMD:-start|stop|status} STATE_DIR"
  mkdir -p "$1"
  STATE_DIR=$(cd "$1" && pwd -P)
  PIDS_FILE=$STATE_DIR/daemons.pids
  SLURM_CONF_FILE=$STATE_DIR/slurm.conf
  LOG_DIR=$STATE_DIR/log
  MUNGE_SOCKET=/run/munge/munge.socket.2
  DB_SOCKET=$STATE_DIR/mysql/mysqld.sock
  DB_CNF=$STATE_DIR/mysql/my.cnf
}

any_recorded_alive() {
  local name pid st
  [[ -f $PIDS_FILE ]] || return 1
  while read -r name pid st; do
    alive "$pid" "$st" && return 0
  done <"$PIDS_FILE"
  return 1
}

# ---------------------------------------------------------------- registry

# registry_entry DIR: the file under $REGISTRY that names the cluster in DIR.
registry_entry() { echo "$REGISTRY/$(printf '%s' "$1" | cksum | cut -d' ' -f1)"; }

# register_owner: record SLURM_TEST_OWNER_PID (and its start time) as the owner of the cluster in
# STATE_DIR, and name STATE_DIR in the registry. Without an owner, nothing (never stale).
register_owner() {
  local owner=${SLURM_TEST_OWNER_PID-} st
  [[ -n $owner ]] || return 0
  [[ $owner =~ ^[0-9]+$ ]] || die "SLURM_TEST_OWNER_PID=$owner is not a pid"
  st=$(proc_start_time "$owner") || die "SLURM_TEST_OWNER_PID=$owner: no such process"
  echo "$owner $st" >"$STATE_DIR/owner"
  mkdir -p "$REGISTRY"
  printf '%s\n' "$STATE_DIR" >"$(registry_entry "$STATE_DIR")"
}

# stale DIR: the cluster in DIR has an owner recorded and that process is gone.
stale() {
  local owner st
  [[ -f $1/owner ]] || return 1
  read -r owner st <"$1/owner" || return 1
  ! alive "$owner" "$st"
}

# cmd_stop_stale: stop every registered cluster whose owner is gone; forget those with nothing left running.
cmd_stop_stale() {
  local entry dir rc=0
  [[ -d $REGISTRY ]] || return 0
  for entry in "$REGISTRY"/*; do
    [[ -f $entry ]] || continue
    dir=$(head -n1 "$entry")
    if [[ ! -d $dir ]]; then
      rm -f "$entry"
    elif stale "$dir"; then
      if ( set_state_dir "$dir"; any_recorded_alive ); then
        say "stopping the stale cluster in $dir: the run that started it (pid $(cut -d' ' -f1 "$dir/owner")) is gone"
        ( cmd_stop "$dir" ) || rc=1
      fi
      rm -f "$entry"
    fi
  done
  return "$rc"
}

# ------------------------------------------------------------------- start

write_configs() {
  local host=$1 mem=$2 ctld_port=$3 slurmd_port=$4 dbd_port=$5 db_port=$6 db_pass=$7 nodes=$8
  local s=$STATE_DIR ctld_addr=127.0.0.1 per_node='' i node_lines partition_lines
  node_lines="NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host CPUs=2 RealMemory=$mem State=UNKNOWN"
  partition_lines="PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP"
  if (( nodes >= 2 )); then
    # The nodes reach the controller through their bridge (their own 127.0.0.1 is their own), and every
    # slurmd of the machine needs a spool, pid file and log of its own (%n: the node's name).
    ctld_addr=$BRIDGE_ADDR per_node=-%n
    # Four CPUs a node (on however many cores the machine has), a quarter of its memory each by default: two
    # two-node trials of two ranks a node run side by side, as two one-CPU jobs do on the localhost node.
    for (( i = 1; i <= nodes; i++ )); do
      node_lines+=$'\n'"NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") NodeHostname=$(node_name "$i") CPUs=4 RealMemory=$mem State=UNKNOWN"
    done
    partition_lines+=$'\n'"PartitionName=$MULTI_PARTITION Nodes=${NODE_PREFIX}[1-$nodes] DefMemPerCPU=$(( mem / 4 )) MaxTime=INFINITE State=UP"
  fi

  cat >"$DB_CNF" <<EOF
[client]
socket=$DB_SOCKET
port=$db_port

[mysqld]
user=root
datadir=$s/mysql/data
socket=$DB_SOCKET
port=$db_port
bind-address=127.0.0.1
pid-file=$s/run/mariadbd.pid
# Its own temporary dir: in the shared /tmp another process's cleanup once took mariadb-install-db's temporary
# table mid-install ("Error on delete of '/tmp/#sql-temptable-...'"), and the cluster never started.
tmpdir=$s/mysql/tmp
skip-name-resolve
skip-log-bin
innodb_buffer_pool_size=256M
innodb_log_file_size=64M
innodb_lock_wait_timeout=900
max_allowed_packet=16M
EOF

  : >"$s/plugstack.conf"

  cat >"$SLURM_CONF_FILE" <<EOF
# Test cluster written by $PROG; all state lives in $s.
ClusterName=$CLUSTER
SlurmctldHost=$host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool$per_node
SlurmctldPidFile=$s/run/slurmctld.pid
SlurmdPidFile=$s/run/slurmd$per_node.pid
# Timestamped logs; the daemons run with -D and also copy every line (plus
# errors from before the log is open) to stderr, i.e. log/<daemon>.stderr.
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd$per_node.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$s/plugstack.conf
# No cgroups in the test machines.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
# Two 1-CPU jobs side by side; a job without --mem gets half the node.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( mem / 2 ))
# Trust this file over the hardware probe, so the node never drains for a mismatch.
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
# Start batch jobs at once instead of batching submissions for up to 3 s.
SchedulerParameters=batch_sched_delay=0
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbd_port
JobCompType=jobcomp/none
# Short timeouts keep the tests fast; finished jobs stay in squeue for MinJobAge
# seconds and in sacct forever.
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=60
WaitTime=0
$node_lines
$partition_lines
EOF

  # slurmdbd reads slurmdbd.conf from the directory of \$SLURM_CONF; it must be
  # owned by SlurmUser and not readable by anyone else.
  ( umask 077; cat >"$s/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
DebugLevel=info
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$s/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db
EOF
  )
  chmod 600 "$s/slurmdbd.conf"
}

node_memory_mb() {
  local mem
  mem=$(timeout 10 slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1) || mem=''
  if [[ -z $mem ]]; then
    mem=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
  fi
  [[ $mem =~ ^[1-9][0-9]*$ ]] || die "cannot determine the node's memory"
  echo "$mem"
}

# Readiness probes; `timeout` bounds clients that would hang on a half-up daemon.
munge_works() { timeout 5 munge -n -S "$MUNGE_SOCKET" | timeout 5 unmunge -S "$MUNGE_SOCKET"; }
db_answers() { timeout 5 mariadb --defaults-file="$DB_CNF" -u root -e 'SELECT 1'; }
dbd_answers() { timeout 10 sacctmgr -n -P list cluster format=cluster; }
ctld_up() { timeout 10 scontrol ping | grep -q 'is UP'; }
node_idle() { [[ $(timeout 10 sinfo -h -N -n "$1" -o %T) == idle ]]; }
sacct_answers() { timeout 10 sacct -n -X -a -S now; }
cluster_registered() { timeout 10 sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; }

start_munged() {
  local s=$STATE_DIR log=$LOG_DIR/munged.log
  if [[ ! -s $s/munge/munge.key ]]; then
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile="$s/munge/munge.key"
    else
      ( umask 077; dd if=/dev/urandom of="$s/munge/munge.key" bs=1024 count=1 status=none )
    fi
  fi
  chmod 400 "$s/munge/munge.key"
  start_daemon munged "$log" munged --foreground --force --socket="$MUNGE_SOCKET" \
    --key-file="$s/munge/munge.key" --pid-file="$s/run/munged.pid" \
    --seed-file="$s/munge/munged.seed" --log-file="$log"
  wait_for munged "$LAST_PID" "$log" munge_works
}

on_start_exit() {
  local rc=$?
  if (( rc != 0 )); then
    say "start failed; stopping the daemons it started"
    cmd_stop "$STATE_DIR" || true
  fi
  exit "$rc"
}

# abandon_nodes: end the node namespaces started so far and remove their bridge; the localhost node
# serves on alone (a host where namespaces cannot be had still runs the single-node tests).
abandon_nodes() {
  local name pid st
  say "no extra nodes: $NODE_PROBLEM"
  while read -r name pid st; do
    [[ $name == ns-* ]] && stop_one "$name" "$pid" "$st"
  done <"$PIDS_FILE"
  sed -i '/^ns-/d' "$PIDS_FILE"
  nodes_down
}

# node_slurmds_idle N: start each node's slurmd inside its namespaces and wait until every node is idle;
# 1 with NODE_PROBLEM set if one dies or the start budget runs out.
node_slurmds_idle() {
  local n=$1 i name pid
  local -a pids=()
  for (( i = 1; i <= n; i++ )); do
    name=$(node_name "$i")
    # shellcheck disable=SC2046 # node_slurmd_cmd prints the command's words
    start_daemon "slurmd-$name" "$LOG_DIR/slurmd-$name.stderr" $(node_slurmd_cmd "$i")
    pids[i]=$LAST_PID
  done
  for (( i = 1; i <= n; i++ )); do
    name=$(node_name "$i") pid=${pids[i]}
    until node_idle "$name" >/dev/null 2>&1; do
      running "$pid" || { NODE_PROBLEM="slurmd of $name exited during startup; read $LOG_DIR/slurmd-$name.stderr"; return 1; }
      (( SECONDS < DEADLINE )) || { NODE_PROBLEM="node $name not idle within ${START_TIMEOUT}s; read $LOG_DIR/slurmd-$name.log"; return 1; }
      sleep 0.2
    done
  done
}

cmd_start() {
  set_state_dir "${1-}"
  local nodes=${2:-0}
  [[ $nodes =~ ^[0-9]+$ && $nodes -ne 1 ]] || die "N=$nodes: give 2 or more extra nodes, or none"
  need_root
  local mis
  mis=$(missing_packages | tr '\n' ' ')
  [[ -z $mis ]] || die "packages missing: ${mis}(run: $0 install)"
  (( ${#STATE_DIR} <= MAX_STATE_DIR_LEN )) \
    || die "STATE_DIR path is ${#STATE_DIR} characters, the unix sockets under it need <= $MAX_STATE_DIR_LEN: $STATE_DIR"
  # A cluster left by a run killed outright still holds munge's socket and its nodes' bridge: stop it first.
  cmd_stop_stale || say "WARNING: a stale cluster did not stop cleanly (see above)"
  if any_recorded_alive; then
    die "a cluster recorded in $PIDS_FILE is still running; run: $0 stop $STATE_DIR"
  fi

  DEADLINE=$(( SECONDS + START_TIMEOUT ))
  trap on_start_exit EXIT
  local t0=$SECONDS
  local s=$STATE_DIR host mem
  host=$(uname -n); host=${host%%.*}
  mem=$(node_memory_mb)
  mkdir -p "$s"/{run,log,state,spool,mysql,mysql/tmp}
  install -d -m 700 "$s/munge"
  install -d -m 755 "${MUNGE_SOCKET%/*}"
  : >"$PIDS_FILE"
  register_owner
  export SLURM_CONF=$SLURM_CONF_FILE
  say "starting cluster $CLUSTER in $s (logs: $LOG_DIR)"

  # --- the extra nodes' namespaces and network first: their addresses go into slurm.conf.
  if (( nodes >= 2 )) && ! nodes_up "$host" "$nodes"; then
    abandon_nodes
    nodes=0
  fi

  local db_pass ctld_port slurmd_port dbd_port db_port
  db_pass=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  pick_port ctld_port; pick_port slurmd_port; pick_port dbd_port; pick_port db_port
  write_configs "$host" "$mem" "$ctld_port" "$slurmd_port" "$dbd_port" "$db_port" "$db_pass" "$nodes"

  # --- munged. Slurm's clients ignore AuthInfo=socket= for slurmdbd connections
  # (sacct/sacctmgr always use /run/munge/munge.socket.2), so munged serves the
  # standard socket. If a munged already answers there, the cluster uses it.
  local log
  if munge_works >/dev/null 2>&1; then
    say "using the munged already serving $MUNGE_SOCKET (not started, will not be stopped)"
  else
    start_munged
  fi

  # --- MariaDB, datadir and socket under STATE_DIR, TCP on 127.0.0.1 only
  log=$LOG_DIR/mariadbd.log
  if [[ ! -d $s/mysql/data/mysql ]]; then
    say "initialising MariaDB datadir $s/mysql/data"
    mariadb-install-db --defaults-file="$DB_CNF" --auth-root-authentication-method=socket \
      --skip-test-db >"$LOG_DIR/mariadb-install-db.log" 2>&1 \
      || die_log "mariadb-install-db failed" "$LOG_DIR/mariadb-install-db.log"
  fi
  start_daemon mariadbd "$log" mariadbd --defaults-file="$DB_CNF"
  wait_for mariadbd "$LAST_PID" "$log" db_answers
  mariadb --defaults-file="$DB_CNF" -u root >>"$log" 2>&1 <<EOF || die_log "creating the slurm database user failed" "$log"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE OR REPLACE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF

  # --- slurmdbd
  log=$LOG_DIR/slurmdbd.log
  start_daemon slurmdbd "$LOG_DIR/slurmdbd.stderr" slurmdbd -D
  wait_for slurmdbd "$LAST_PID" "$log" dbd_answers
  # Register the cluster (and its root association) before slurmctld connects.
  cluster_registered || sacctmgr -i add cluster "$CLUSTER" >>"$LOG_DIR/sacctmgr.log" 2>&1 \
    || die_log "sacctmgr add cluster $CLUSTER failed" "$LOG_DIR/sacctmgr.log"

  # --- slurmctld
  log=$LOG_DIR/slurmctld.log
  start_daemon slurmctld "$LOG_DIR/slurmctld.stderr" slurmctld -D -f "$SLURM_CONF_FILE"
  wait_for slurmctld "$LAST_PID" "$log" ctld_up

  # --- slurmd: the localhost node's, then each extra node's inside its namespaces
  local suffix=''
  (( nodes >= 2 )) && suffix=-$host
  log=$LOG_DIR/slurmd$suffix.log
  start_daemon slurmd "$LOG_DIR/slurmd$suffix.stderr" slurmd -D -f "$SLURM_CONF_FILE" -N "$host"
  wait_for slurmd "$LAST_PID" "$log" node_idle "$host"
  if (( nodes >= 2 )) && ! node_slurmds_idle "$nodes"; then
    say "the extra nodes are unavailable: $NODE_PROBLEM"
  fi
  wait_for "slurmdbd (sacct)" "$(awk '$1 == "slurmdbd" { print $2 }' "$PIDS_FILE")" \
    "$LOG_DIR/slurmdbd.log" sacct_answers

  trap - EXIT
  say "cluster $CLUSTER up in $(( SECONDS - t0 ))s: node $host idle in partition $PARTITION"
  echo "SLURM_CONF=$SLURM_CONF_FILE"
  if [[ -n $NODE_PROBLEM ]]; then
    echo "MULTI_UNAVAILABLE=$NODE_PROBLEM"
  elif (( nodes >= 2 )); then
    local i names=''
    for (( i = 1; i <= nodes; i++ )); do names+=${names:+,}$(node_name "$i"); done
    say "nodes $names idle in partition $MULTI_PARTITION"
    echo "MULTI_PARTITION=$MULTI_PARTITION"
    echo "MULTI_NODES=$names"
  fi
}

# -------------------------------------------------------------------- stop

stop_one() {
  local name=$1 pid=$2 st=$3 i
  if ! alive "$pid" "$st"; then
    say "$name (pid $pid) already gone"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for (( i = 0; i < STOP_TIMEOUT * 10; i++ )); do
    alive "$pid" "$st" || { say "stopped $name (pid $pid)"; return 0; }
    sleep 0.1
  done
  say "$name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT}s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for (( i = 0; i < 50; i++ )); do
    alive "$pid" "$st" || return 0
    sleep 0.1
  done
  say "WARNING: $name (pid $pid) still running after SIGKILL"
  return 1
}

# Cancel the cluster's jobs while slurmctld and slurmd are still up, so no
# slurmstepd or job process outlives the cluster.
cancel_jobs() {
  local ids i
  ids=$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ') || return 0
  [[ -n ${ids// } ]] || return 0
  say "cancelling jobs: $ids"
  # shellcheck disable=SC2086 # one argument per job id
  timeout 10 scancel $ids 2>/dev/null || true
  for (( i = 0; i < 100; i++ )); do # KillWait (5 s) + slack
    [[ -z $(timeout 10 squeue -h -o %A 2>/dev/null) ]] && return 0
    sleep 0.2
  done
  say "WARNING: jobs still not finished: $(timeout 10 squeue -h -o '%A %T' 2>/dev/null | tr '\n' ' ')"
}

cmd_stop() {
  set_state_dir "${1-}"
  if [[ ! -s $PIDS_FILE ]]; then
    say "no daemons recorded in $PIDS_FILE; nothing to stop"
    return 0
  fi
  if any_recorded_alive && [[ -f $SLURM_CONF_FILE ]]; then
    SLURM_CONF=$SLURM_CONF_FILE cancel_jobs
  fi
  local name pid st rc=0
  # Reverse start order: slurmds, slurmctld, slurmdbd, mariadbd, munged, the nodes' namespaces.
  while read -r name pid st; do
    [[ -n $name ]] || continue
    stop_one "$name" "$pid" "$st" || rc=1
  done < <(tac "$PIDS_FILE")
  nodes_down || rc=1
  mv -f "$PIDS_FILE" "$PIDS_FILE.stopped"
  rm -f "$(registry_entry "$STATE_DIR")"
  return "$rc"
}

# ------------------------------------------------------------------ status

cmd_status() {
  set_state_dir "${1-}"
  if [[ ! -s $PIDS_FILE ]]; then
    echo "stopped (no daemons recorded in $PIDS_FILE)"
    return 3
  fi
  local name pid st rc=0
  while read -r name pid st; do
    if alive "$pid" "$st"; then echo "$name: running (pid $pid)"; else echo "$name: NOT running (pid $pid)"; rc=3; fi
  done <"$PIDS_FILE"
  echo "SLURM_CONF=$SLURM_CONF_FILE"
  SLURM_CONF=$SLURM_CONF_FILE sinfo -h -o 'node %N: %T (partition %P)' 2>/dev/null || true
  return "$rc"
}

main() {
  CMD=${1-}
  case $CMD in
    install) cmd_install ;;
    missing) cmd_missing ;;
    stop-stale) cmd_stop_stale ;;
    start) cmd_start "${2-}" "${3-}" ;;
    stop) cmd_stop "${2-}" ;;
    status) cmd_status "${2-}" ;;
    *) die "usage: $PROG install | missing | start STATE_DIR [N] | stop STATE_DIR | status STATE_DIR | stop-stale" ;;
  esac
}

main "$@"
