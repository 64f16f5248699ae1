# Nodes of their own on one machine, for the test cluster (sourced by cluster.sh; not run by itself).
#
# Each node is a process holding a network, UTS and mount namespace of its own (unshare), so it has its
# own hostname and its own loopback while it shares the filesystem with the host, as nodes with an NFS
# home do: a job that reaches another node through 127.0.0.1, or names itself by the host's name, fails
# here as it would on a real cluster (on nodes sharing one hostname and loopback it would pass unseen).
# A veth pair links each node to a bridge on the host, on a /24 of the benchmarking range 198.18.0.0/15
# (RFC 2544: never routed on the internet), with no uplink and no default route in the nodes: traffic
# goes between the nodes and the host, nothing leaves the machine. Each node's /etc/hosts is a file of
# the state dir bind-mounted in its own mount namespace, naming every node and the controller's host;
# the host's own /etc/hosts, hostname and routes are never touched.
#
# Needs: unshare and nsenter (util-linux), ip (iproute2), root. Uses from cluster.sh: say, die,
# proc_start_time, alive, $STATE_DIR, $PIDS_FILE, $LOG_DIR.

readonly NODE_NET=198.18      # the /24 is 198.18.K.0, K picked free at start
readonly NODE_PREFIX=mn       # node names mn1, mn2, ...
readonly NODE_WAIT_S=10       # for a namespace to exist after its holder is started

# Set by nodes_network: the bridge, the /24's third octet, the host's address on it.
BRIDGE='' SUBNET_K='' BRIDGE_ADDR=''
NODE_PROBLEM='' # why the nodes could not be set up (nodes_* return 1 and set it)

node_name() { echo "$NODE_PREFIX$1"; }
node_addr() { echo "$NODE_NET.$SUBNET_K.$(( 10 + $1 ))"; }
network_file() { echo "$STATE_DIR/network"; }

nodes_tools() {
  local tool
  for tool in unshare nsenter ip; do
    command -v "$tool" >/dev/null || { NODE_PROBLEM="$tool not found (util-linux, iproute2)"; return 1; }
  done
}

# nodes_network: a bridge with a /24 no interface on this host uses yet. The bridge's name carries the
# octet, so creating it is the claim: two clusters starting at once never take the same /24.
nodes_network() {
  local k tries
  for (( tries = 0; tries < 50; tries++ )); do
    k=$(( 1 + RANDOM % 254 ))
    ip -4 -o addr show 2>/dev/null | grep -q " inet $NODE_NET\.$k\." && continue
    ip link add "swb$k" type bridge 2>/dev/null || continue
    BRIDGE=swb$k SUBNET_K=$k BRIDGE_ADDR=$NODE_NET.$k.1
    echo "bridge $BRIDGE $SUBNET_K" >"$(network_file)"
    if ! { ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE" && ip link set "$BRIDGE" up; } 2>>"$LOG_DIR/nodes.log"; then
      NODE_PROBLEM="cannot configure bridge $BRIDGE (see $LOG_DIR/nodes.log)"
      return 1
    fi
    say "bridge $BRIDGE at $BRIDGE_ADDR/24 (no uplink)"
    return 0
  done
  NODE_PROBLEM="cannot create a bridge on $NODE_NET.0.0/15 (ip link add ... type bridge failed or every /24 tried is in use)"
  return 1
}

# own_namespaces PID: PID's network, UTS and mount namespaces are all not this script's. Until unshare(2)
# has run in it, `nsenter -t PID` would enter the host's own: naming the node there renames the host.
own_namespaces() {
  local ns
  for ns in net uts mnt; do
    [[ $(readlink "/proc/$1/ns/$ns" 2>/dev/null) != "$(readlink "/proc/$$/ns/$ns")" ]] || return 1
    [[ -n $(readlink "/proc/$1/ns/$ns" 2>/dev/null) ]] || return 1
  done
}

# wait_own_namespaces PID: until own_namespaces holds (`setsid unshare ... &` returns before it has run).
wait_own_namespaces() {
  local i
  for (( i = 0; i < NODE_WAIT_S * 20; i++ )); do
    own_namespaces "$1" && return 0
    [[ -e /proc/$1 ]] || return 1
    sleep 0.05
  done
  return 1
}

# nodes_hosts N: the /etc/hosts every node sees: itself and its peers by name, the controller's host.
nodes_hosts() {
  local i host=$1 n=$2
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    echo "$BRIDGE_ADDR $host"
    for (( i = 1; i <= n; i++ )); do echo "$(node_addr "$i") $(node_name "$i")"; done
  } >"$STATE_DIR/hosts"
}

# node_up I: start node I's namespace holder, wait for its namespaces, then name it, give it the hosts
# file and its end of a veth pair. The holder is recorded as a daemon, so `stop` ends it (and with it the
# namespaces and the veth pair) after the node's slurmd.
node_up() {
  local i=$1 name pid st host_name
  name=$(node_name "$i")
  host_name=$(uname -n)
  setsid unshare --net --uts --mount --propagation private sleep infinity </dev/null >/dev/null 2>>"$LOG_DIR/nodes.log" &
  pid=$!
  st=$(proc_start_time "$pid") || { NODE_PROBLEM="unshare for $name exited at once (see $LOG_DIR/nodes.log)"; return 1; }
  echo "ns-$name $pid $st" >>"$PIDS_FILE"
  if ! wait_own_namespaces "$pid"; then
    NODE_PROBLEM="unshare --net --uts --mount gave $name no namespaces of its own within ${NODE_WAIT_S}s (see $LOG_DIR/nodes.log)"
    return 1
  fi
  if ! {
    nsenter -t "$pid" --uts hostname "$name" &&
      nsenter -t "$pid" --mount mount --bind "$STATE_DIR/hosts" /etc/hosts &&
      ip link add "swv${SUBNET_K}n$i" type veth peer name eth0 netns "$pid" &&
      ip link set "swv${SUBNET_K}n$i" master "$BRIDGE" up &&
      nsenter -t "$pid" --net ip link set lo up &&
      nsenter -t "$pid" --net ip addr add "$(node_addr "$i")/24" dev eth0 &&
      nsenter -t "$pid" --net ip link set eth0 up
  } 2>>"$LOG_DIR/nodes.log"; then
    NODE_PROBLEM="configuring node $name failed (see $LOG_DIR/nodes.log)"
    return 1
  fi
  # The one thing that must never happen: the host renamed (a namespace entered before it existed).
  [[ $(uname -n) == "$host_name" ]] || die "the host's name changed to $(uname -n) while naming $name; set it back: hostname $host_name"
  NODE_PIDS[i]=$pid
  say "node $name: $(node_addr "$i") in namespaces of pid $pid"
}

# nodes_up HOST N: the bridge, the hosts file and N nodes; 1 with NODE_PROBLEM set if any step fails.
declare -a NODE_PIDS=()
nodes_up() {
  local host=$1 n=$2 i
  [[ $(id -u) -eq 0 ]] || { NODE_PROBLEM="nodes need root"; return 1; }
  nodes_tools || return 1
  nodes_network || return 1
  nodes_hosts "$host" "$n"
  for (( i = 1; i <= n; i++ )); do node_up "$i" || return 1; done
}

# node_slurmd_cmd I: the command that runs node I's slurmd inside its namespaces (nsenter execs it: the
# recorded pid is slurmd's own).
node_slurmd_cmd() {
  echo nsenter -t "${NODE_PIDS[$1]}" --net --uts --mount -- slurmd -D -f "$SLURM_CONF_FILE" -N "$(node_name "$1")"
}

# nodes_down: remove the bridge (the nodes' veth pairs went with their namespaces when `stop` ended the
# holders). Only a bridge this cluster recorded.
nodes_down() {
  local file kind name
  file=$(network_file)
  [[ -f $file ]] || return 0
  read -r kind name _ <"$file" || true
  if [[ $kind == bridge && $name == swb* ]] && ip link show "$name" >/dev/null 2>&1; then
    ip link del "$name" && say "removed bridge $name"
  fi
  mv -f "$file" "$file.removed"
}
