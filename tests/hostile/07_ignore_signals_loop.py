# harm: ignore SIGTERM/SIGINT/SIGXCPU so a polite kill does not stop it, then spin.
# check: SIGKILL at the wall-clock limit ends it -> timeout; no process left.
import signal

for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
while True:
    pass
