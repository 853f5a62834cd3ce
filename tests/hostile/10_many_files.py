# harm: exhaust inodes by creating a huge number of files.
# check: bounded by the working directory's size/inodes and the time limit; everything is removed after.
import os

i = 0
while True:
    with open(f"f{i}", "w") as fh:
        fh.write("x")
    i += 1
