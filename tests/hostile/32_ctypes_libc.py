# harm: call libc directly through ctypes (unlink a file, fork) to get around Python-level checks.
# check: victim.txt intact; no process left.
# layers: os
import ctypes

libc = ctypes.CDLL(None)
libc.unlink(b"{CANARY}/victim.txt")
for _ in range(100):
    libc.fork()
print("libc called")
