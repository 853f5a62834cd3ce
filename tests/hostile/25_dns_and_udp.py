# harm: leak data through DNS lookups and UDP packets.
# check: name resolution and sendto fail; verdict failure.
# layers: os
import socket

print(socket.gethostbyname("example.com"))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"leak", ("8.8.8.8", 53))
print("sent")
