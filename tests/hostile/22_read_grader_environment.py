# harm: read the grader's environment (API keys, tokens) through /proc.
# check: the marker variable set in the grader's environment appears in no output.
# layers: os
import os

for path in ("/proc/{PID}/environ", "/proc/self/environ", "/proc/1/environ"):
    try:
        print(open(path, "rb").read())
    except OSError as exc:
        print(type(exc).__name__)
print(dict(os.environ))
