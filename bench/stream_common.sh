# Shell functions the streaming benchmarks share (sourced, not run): the page cache of a run's
# files dropped before it, the device's bytes read counted around it, and a memory cgroup to
# run it in. A sourcing script defines `before_run` (called first thing by `in_cgroup`).

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

# Runs "$@" inside a cgroup of $1 bytes (or unlimited, saying so) after `before_run`, stdout
# to $2; the bytes the device holding $2 read meanwhile go to $2 with .json replaced by
# .device. Returns the command's exit status.
in_cgroup() {
  local limit="$1" out="$2" dir before status=0
  shift 2
  dir=$(make_cgroup "$limit" "$(basename "$out" .json)")
  before_run
  before=$(device_read_bytes "$(dirname "$out")")
  if [ -n "$dir" ]; then
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$dir" "$@" > "$out" || status=$?
    for f in memory.peak memory.max_usage_in_bytes; do
      [ -f "$dir/$f" ] && echo "  cgroup limit $((limit >> 20)) MiB, cgroup peak $(( $(cat "$dir/$f") >> 20 )) MiB (page cache included)"
    done
    rmdir "$dir" 2>/dev/null || true
  else
    echo "  (no memory cgroup could be made here: run without a limit)"
    "$@" > "$out" || status=$?
  fi
  if [ "$before" -ge 0 ]; then
    echo $(( $(device_read_bytes "$(dirname "$out")") - before )) > "${out%.json}.device"
  else
    echo -1 > "${out%.json}.device"
  fi
  return "$status"
}
