# harm: start thousands of threads (threads count as tasks; exhausts pids and memory).
# check: thread creation fails at RLIMIT_NPROC / address space; verdict failure; nothing left.
# layers: os
import threading
import time

threads = []
while True:
    t = threading.Thread(target=time.sleep, args=(60,))
    t.start()
    threads.append(t)
