# harm: run a shell through subprocess to delete a file outside.
# check: victim.txt intact.
# layers: os
import subprocess

print(subprocess.run(["/bin/sh", "-c", "rm -f {CANARY}/victim.txt; cat {CANARY}/secret_*.txt"], capture_output=True).stdout)
