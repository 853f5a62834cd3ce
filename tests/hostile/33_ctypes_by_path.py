# harm: load the _ctypes extension by file path (around any "import ctypes" check), look up unlink() in
#   libc by hand and call it on a file outside.
# check: victim.txt intact (the symbol lookup and the foreign call are refused).
import glob
import importlib.machinery
import importlib.util
import sys

path = glob.glob(sys.base_prefix + "/lib/python3*/lib-dynload/_ctypes*.so")[0]
spec = importlib.util.spec_from_file_location("_ctypes", path, loader=importlib.machinery.ExtensionFileLoader("_ctypes", path))
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
handle = mod.dlopen(None)
unlink = mod.dlsym(handle, "unlink")
mod.call_function(unlink, (b"{CANARY}/victim.txt",))
print("called unlink")
