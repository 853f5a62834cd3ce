# harm: find and disable the in-process audit hook (gc, frames, code objects), then write outside.
# check: victim.txt intact; the tampering itself is refused.
import gc
import sys

try:
    for obj in gc.get_objects():
        if callable(obj) and getattr(obj, "__name__", "") == "hook":
            obj.__code__ = (lambda *a: None).__code__
except Exception as exc:
    print("gc:", type(exc).__name__)
try:
    f = sys._getframe()
    while f is not None:
        f.f_globals.pop("install_guard", None)
        f = f.f_back
except Exception as exc:
    print("frames:", type(exc).__name__)
with open("{CANARY}/victim.txt", "w") as fh:
    fh.write("after tampering")
print("tampered")
