# Shell functions the streaming benchmarks share (sourced, not run): the page cache of a run's
# files dropped before it, the device's bytes read counted around it, and a memory cgroup (and,
# for a capped run, a block-I/O throttle: READ_CAP bytes a second) to run it in. A sourcing script defines `before_run` (called first thing by `in_cgroup`).

# Drops the page cache of every file under the folders and of the files given (posix_fadvise
# DONTNEED), so that no run reads what an earlier one left cached.
drop_cache_of() {
  python3 - "$@" <<'PY'
import os, sys
def drop(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
for p in sys.argv[1:]:
    if os.path.isdir(p):
        for d, _, files in os.walk(p):
            for f in files:
                drop(os.path.join(d, f))
    else:
        drop(p)
PY
}

# Bytes read so far by the block device that holds $1 (/proc/diskstats counts 512-byte
# sectors); -1 where the device has no row there.
device_read_bytes() {
  python3 -c '
import os, sys
dev = os.stat(sys.argv[1]).st_dev
rows = [l.split() for l in open("/proc/diskstats")]
print(next((int(f[5]) * 512 for f in rows if (int(f[0]), int(f[1])) == (os.major(dev), os.minor(dev))), -1))
' "$1"
}

# A fresh memory cgroup limited to $1 bytes, named after $2; prints its folder, or nothing if
# none can be made (that needs root and a writable memory controller).
make_cgroup() {
  local name="minirun-bench-$$-$2" dir
  if grep -qs memory /sys/fs/cgroup/cgroup.controllers; then
    dir="/sys/fs/cgroup/$name"
    mkdir "$dir" 2>/dev/null && echo "$1" > "$dir/memory.max" 2>/dev/null && echo 0 > "$dir/memory.swap.max" 2>/dev/null || true
    [ -f "$dir/memory.max" ] && echo "$dir"
  else
    dir="/sys/fs/cgroup/memory/$name"
    if mkdir "$dir" 2>/dev/null && echo "$1" > "$dir/memory.limit_in_bytes" 2>/dev/null; then
      echo "$1" > "$dir/memory.memsw.limit_in_bytes" 2>/dev/null || true
      echo "$dir"
    fi
  fi
}

# "MAJOR:MINOR" of the block device holding $1.
device_of() {
  python3 -c 'import os, sys; d = os.stat(sys.argv[1]).st_dev; print(f"{os.major(d)}:{os.minor(d)}")' "$1"
}

# A fresh block-I/O cgroup throttling reads of the device holding $2 to $1 bytes a second, named
# after $3; prints its folder, or nothing if none can be made (root and a block-I/O controller).
make_throttle() {
  local name="minirun-bench-$$-io-$3" dev dir
  dev=$(device_of "$2")
  if grep -qs io /sys/fs/cgroup/cgroup.controllers; then
    dir="/sys/fs/cgroup/$name"
    mkdir "$dir" 2>/dev/null && echo "$dev rbps=$1" > "$dir/io.max" 2>/dev/null && echo "$dir"
  else
    dir="/sys/fs/cgroup/blkio/$name"
    mkdir "$dir" 2>/dev/null && echo "$dev $1" > "$dir/blkio.throttle.read_bps_device" 2>/dev/null \
      && echo "$dir"
  fi
}

# Whether reads of the device holding $1 can be throttled here.
can_throttle() {
  local dir
  dir=$(make_throttle 1000000000 "$1" probe)
  [ -n "$dir" ] && rmdir "$dir" 2>/dev/null
  [ -n "$dir" ]
}

# Runs "$@" inside a cgroup of $1 bytes (or unlimited, saying so) after `before_run`, stdout
# to $2; the bytes the device holding $2 read meanwhile go to $2 with .json replaced by
# .device. Returns the command's exit status.
in_cgroup() {
  local limit="$1" out="$2" dir before status=0
  shift 2
  dir=$(make_cgroup "$limit" "$(basename "$out" .json)")
  local throttle=""
  if [ -n "${READ_CAP:-}" ]; then
    throttle=$(make_throttle "$READ_CAP" "$(dirname "$out")" "$(basename "$out" .json)")
    [ -n "$throttle" ] || { echo "  !! no block-I/O throttle could be made for a capped run"; return 1; }
    echo "  reads of $(device_of "$(dirname "$out")") capped at $READ_CAP bytes/s"
  fi
  before_run
  before=$(device_read_bytes "$(dirname "$out")")
  if [ -n "$dir" ]; then
    sh -c 'echo $$ > "$0/cgroup.procs" && { [ -z "$1" ] || echo $$ > "$1/cgroup.procs"; } && shift && exec "$@"' \
      "$dir" "$throttle" "$@" > "$out" || status=$?
    for f in memory.peak memory.max_usage_in_bytes; do
      [ -f "$dir/$f" ] && echo "  cgroup limit $((limit >> 20)) MiB, cgroup peak $(( $(cat "$dir/$f") >> 20 )) MiB (page cache included)"
    done
    rmdir "$dir" 2>/dev/null || true
    [ -z "$throttle" ] || rmdir "$throttle" 2>/dev/null || true
  else
    echo "  (no memory cgroup could be made here: run without a limit)"
    sh -c '{ [ -z "$0" ] || echo $$ > "$0/cgroup.procs"; } && exec "$@"' "$throttle" "$@" > "$out" \
      || status=$?
    [ -z "$throttle" ] || rmdir "$throttle" 2>/dev/null || true
  fi
  if [ "$before" -ge 0 ]; then
    echo $(( $(device_read_bytes "$(dirname "$out")") - before )) > "${out%.json}.device"
  else
    echo -1 > "${out%.json}.device"
  fi
  return "$status"
}
