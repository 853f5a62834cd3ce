# harm: hold a slot forever without using CPU (escapes a CPU-time limit).
# check: killed at the wall-clock limit (not only RLIMIT_CPU) -> timeout.
import time

time.sleep(10 ** 6)
print("woke up")
