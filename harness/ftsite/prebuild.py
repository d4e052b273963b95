"""The guest images the tests boot, built side by side before they run
(`make test`, after the tests' compilation): the default image and the
web image (ftsite.web_image: services.rs's and the cluster tests'
PostgreSQL image). Each build configures its packages in a guest of one
hart, so on a 2-core host the two builds fill the cores instead of one
waiting for the other (the web image was built inside services.rs, alone,
after the default one). An image already built is only checked.

    FTVM=target/release/ftvm harness/run ftsite.prebuild
"""

import os
import subprocess
import sys
import threading
import time

from .host import web_image


def main():
    ftvm = os.environ.get("FTVM", "target/release/ftvm")
    failed = []

    def default():
        r = subprocess.run([ftvm, "image", "build"], capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(f"ftvm image build failed ({r.returncode}): {r.stderr.strip()[-2000:]}")

    def web():
        web_image(ftvm)

    def timed(name, build):
        t0 = time.monotonic()
        try:
            build()
            print(f"prebuild: the {name} image ready in {time.monotonic() - t0:.0f} s", flush=True)
        except Exception as e:  # reported, and the run fails
            failed.append(f"the {name} image: {e}")

    threads = [threading.Thread(target=timed, args=a) for a in (("default", default), ("web", web))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in failed:
        print(f"prebuild: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
