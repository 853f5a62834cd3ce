# harm: overwrite an existing file outside its directory.
# check: victim.txt content unchanged.
# layers: os
with open("{CANARY}/victim.txt", "w") as fh:
    fh.write("overwritten")
print("overwritten")
