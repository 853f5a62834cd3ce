# harm: kill every process it may signal (kill(-1)) and the grader by its pid.
# check: the grader (pid {PID}) is alive and grades a correct program afterwards.
# layers: os
import os
import signal

for target in ({PID}, -1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as exc:
        print(type(exc).__name__)
