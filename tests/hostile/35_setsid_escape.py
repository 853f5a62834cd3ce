# harm: leave the supervisor's session with setsid and fork a long-lived daemon.
# check: no process of the sandbox remains afterwards (session scan, uid scan, pid namespace).
# layers: os
import os
import time

pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(120)
    os._exit(0)
print("daemon started")
