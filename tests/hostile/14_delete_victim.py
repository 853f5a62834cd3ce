# harm: delete a file outside its directory.
# check: victim.txt still there, unchanged.
# layers: os
import os

os.remove("{CANARY}/victim.txt")
print("deleted")
