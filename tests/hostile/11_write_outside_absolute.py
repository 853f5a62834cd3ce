# harm: create a file outside its directory (absolute path).
# check: {CANARY} has no new file.
# layers: os
with open("{CANARY}/pwned_abs.txt", "w") as fh:
    fh.write("pwned")
print("written")
