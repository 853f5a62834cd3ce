# harm: make a symlink in its own directory that points outside, then write through it.
# check: victim.txt unchanged.
# layers: os
import os

os.symlink("{CANARY}/victim.txt", "link.txt")
with open("link.txt", "w") as fh:
    fh.write("through the link")
print("wrote through symlink")
