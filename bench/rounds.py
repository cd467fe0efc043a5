"""Measurements that noise cannot flatter: each command timed while the rest of the machine is
watched, so a figure taken while something else ran is known as such.

A benchmark built on this module runs its sides in interleaved rounds (the order rotated each
round, see `rotated`), measures every command with `measure`, which records beside it the CPU
the rest of the machine used meanwhile (other processes, and time the hypervisor gave to other
guests), and leaves out of its summary the rounds in which that foreign load passed a
threshold. Medians and ranges over the kept rounds are what it reports (`summary`).

Standard library only: any python3 runs it.
"""

import os
import resource
import statistics
import subprocess
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_model():
    """The CPU's model name as lscpu prints it, and its logical CPU count."""
    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs"


def _system_ticks():
    """(busy, steal) ticks of all CPUs together since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal


def _process_ticks():
    """{pid: (name, utime + stime ticks)} of every process visible now."""
    seen = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # it ended while we looked
        # The name is in parentheses and may hold spaces; the fields after it are fixed.
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        rest = stat[stat.rfind(")") + 2:].split()
        seen[int(entry)] = (name, int(rest[11]) + int(rest[12]))
    return seen


def _cpu_seconds(usage):
    return usage.ru_utime + usage.ru_stime


def measure(argv, stdout_path, env=None):
    """Runs argv to completion with stdout to stdout_path and returns what the machine did
    meanwhile: wall seconds, the command's own CPU seconds, the foreign load in cores (CPU
    used by other processes, including steal: time the hypervisor ran other guests on our
    CPUs) and the three busiest other processes. Raises CalledProcessError if argv fails."""
    me = os.getpid()
    busy0, steal0 = _system_ticks()
    procs0 = _process_ticks()
    children0 = _cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN))
    self0 = _cpu_seconds(resource.getrusage(resource.RUSAGE_SELF))
    load1 = os.getloadavg()[0]
    start = time.perf_counter()
    with open(stdout_path, "w") as out:
        subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, check=True, env=env)
    wall = time.perf_counter() - start
    own = _cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN)) - children0
    procs1 = _process_ticks()
    mine = _cpu_seconds(resource.getrusage(resource.RUSAGE_SELF)) - self0
    busy1, steal1 = _system_ticks()
    others = max(0.0, (busy1 - busy0) / TICK - own - mine)
    steal = (steal1 - steal0) / TICK
    busiest = []
    for pid, (name, ticks) in procs1.items():
        if pid == me or pid not in procs0 or procs0[pid][0] != name:
            continue
        used = (ticks - procs0[pid][1]) / TICK / wall
        if used >= 0.01:
            busiest.append((round(used, 3), name))
    busiest.sort(reverse=True)
    return {
        "wall_seconds": round(wall, 3),
        "own_cpu_seconds": round(own, 3),
        "foreign_cores": round((others + steal) / wall, 3),
        "steal_cores": round(steal / wall, 3),
        "loadavg_1min_before": load1,
        "busiest_others": [{"name": n, "cores": c} for c, n in busiest[:3]],
    }


def rotated(items, round_index):
    """items in the order of round `round_index`: each item leads in turn."""
    k = round_index % len(items)
    return items[k:] + items[:k]


def summary(values):
    """Median, minimum and maximum of a non-empty list (None for an empty one)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}
