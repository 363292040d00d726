# Sourced by probes that run programs under a node daemon: `start_daemon BIN CONFIG DIR` starts
# `BIN daemon` on $TIERMEM_SOCKET with CONFIG, its log in DIR/daemon.log, and polls its status
# every 0.5 s into DIR/status.jsonl ({"t": unix seconds, "status": `status --json` or null});
# `stop_daemon` stops both and compresses the polls (DIR/status.jsonl.xz).
start_daemon() {
  local bin=$1 config=$2
  daemon_dir=$3
  "$bin" daemon --config "$config" --socket "$TIERMEM_SOCKET" 2> "$daemon_dir/daemon.log" &
  daemon_pid=$!
  sleep 1
  ( while kill -0 "$daemon_pid" 2>/dev/null; do
      printf '{"t": %s, "status": %s}\n' "$(date +%s.%N)" "$("$bin" status --json --socket "$TIERMEM_SOCKET" 2>/dev/null | tr -d '\n' || echo null)"
      sleep 0.5
    done > "$daemon_dir/status.jsonl" ) &
  poll_pid=$!
}
stop_daemon() {
  kill "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; kill "$poll_pid" 2>/dev/null; wait "$poll_pid" 2>/dev/null
  xz -9 "$daemon_dir/status.jsonl"
}
