# Sourced by the NATS benchmarks: a 3-node nats-server cluster with JetStream on loopback.
#   start_nats_cluster DIR BASE_PORT   nodes listen on BASE_PORT+20.., route on BASE_PORT+10..;
#   their data and logs go in DIR. Sets SERVERS (comma-separated URLs), appends to NATS_PIDS,
#   and returns once the cluster has a JetStream meta leader (or 20 s passed).
start_nats_cluster() {
  local dir=$1 base=$2 routes="" i
  SERVERS=""
  for i in 0 1 2; do routes+="${routes:+, }nats-route://127.0.0.1:$((base + 10 + i))"; done
  for i in 0 1 2; do
    cat >"$dir/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$((base + 20 + i))
jetstream { store_dir: "$dir/n$i", max_memory_store: 64MB, max_file_store: 4GB }
cluster { name: bench, listen: 127.0.0.1:$((base + 10 + i)), routes: [$routes] }
CONF
    nats-server -c "$dir/n$i.conf" >"$dir/n$i.log" 2>&1 &
    NATS_PIDS+=($!)
    SERVERS+="${SERVERS:+,}nats://127.0.0.1:$((base + 20 + i))"
  done
  for _ in $(seq 100); do grep -q "JetStream cluster new metadata leader" "$dir"/n*.log && return 0; sleep 0.2; done
}
