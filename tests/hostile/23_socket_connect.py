# harm: exfiltrate over the network (TCP connect to the outside).
# check: connect fails (no network namespace route / socket refused); verdict failure.
# layers: os
import socket

s = socket.create_connection(("1.1.1.1", 80), timeout=2)
s.sendall(b"GET / HTTP/1.0\r\n\r\n")
print("connected")
