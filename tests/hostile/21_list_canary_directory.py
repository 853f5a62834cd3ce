# harm: learn the names of files outside (the secret's random file name).
# check: the secret's file name appears in no output.
# layers: os
import os

print(sorted(os.listdir("{CANARY}")))
print([e.name for e in os.scandir("{CANARY}")])
