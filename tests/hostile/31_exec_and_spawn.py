# harm: replace itself with a shell (os.execv) or spawn one (os.posix_spawn).
# check: {CANARY} unchanged.
import os

try:
    os.posix_spawn("/bin/sh", ["sh", "-c", "touch {CANARY}/pwned_spawn.txt"], {})
except Exception as exc:
    print(type(exc).__name__)
os.execv("/bin/sh", ["sh", "-c", "touch {CANARY}/pwned_exec.txt"])
