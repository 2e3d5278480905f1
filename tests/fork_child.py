"""A `python -m tests.fork_child CODE [sleep]` child for tests/infra/test_forking.py: reports what
it was started with (environment, arguments, process group) and whether its exit handlers ran."""

import atexit
import os
import subprocess
import sys
import time

print(f"mark={os.environ.get('FORK_CHILD_MARK')} args={sys.argv[1:]}", flush=True)
print(f"leader={os.getpgid(0) == os.getpid()} name={__name__}", flush=True)
atexit.register(lambda: print("exit handlers ran", flush=True))
if len(sys.argv) > 2:  # a grandchild in the group, then wait to be stopped
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[1]))
