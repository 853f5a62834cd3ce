# harm: open a listening port on the host (a backdoor).
# check: nothing listens on 127.0.0.1:{PORT} afterwards, and nothing accepted a connection during the run.
# layers: os
import socket
import time

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT}))
s.listen()
print("listening")
time.sleep(30)
