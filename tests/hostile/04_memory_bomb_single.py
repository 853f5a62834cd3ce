# harm: one huge allocation (64 GB) to trigger the OOM killer.
# check: MemoryError at the address-space limit -> runtime error.
x = bytearray(64 * 1024 ** 3)
print(len(x))
