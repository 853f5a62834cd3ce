# harm: burn CPU forever (a busy loop that never yields).
# check: killed at the per-test wall-clock limit -> timeout; no process left.
# layers: os
n = 0
while True:
    n += 1
