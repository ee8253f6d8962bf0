# Sourced by the benchmarks/h200_*.sh scripts: `wall CMD...` runs CMD (stdout discarded) and prints
# its wall time, the 10 M-record read speed that means, its system time, minor faults and max RSS
# (the GPU machine's image has no /usr/bin/time).
wall() {
  python3 -c '
import resource, subprocess, sys, time
t = time.perf_counter(); subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); d = time.perf_counter() - t
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{d:.3f} s wall ({10_000_110 / d / 1e6:.2f} M rec/s), {u.ru_stime:.2f} s sys, {u.ru_minflt} minor faults, max RSS {u.ru_maxrss // 1024} MB")
' "$@"
}
