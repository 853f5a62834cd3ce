# harm: flood the grader with output (memory / disk of whoever collects stdout).
# check: stdout is a file capped by RLIMIT_FSIZE; the run fails (output limit or runtime error).
import sys

line = "x" * 65536 + "\n"
while True:
    sys.stdout.write(line)
