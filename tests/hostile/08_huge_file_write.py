# harm: fill the disk with one enormous file in its working directory.
# check: the write fails at RLIMIT_FSIZE (EFBIG) -> runtime error; the directory is removed afterwards.
# layers: os
with open("big.bin", "wb") as fh:
    block = b"\0" * (1 << 20)
    for _ in range(100_000):
        fh.write(block)
print("wrote 100 GB")
