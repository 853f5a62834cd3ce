# harm: memory bomb: allocate until the machine swaps or the OOM killer picks a victim.
# check: the allocation fails at the address-space limit (MemoryError -> runtime error); grader alive.
# layers: os
chunks = []
while True:
    chunks.append(bytearray(64 * 1024 * 1024))
