#!/usr/bin/env python3
"""The binaries scripts/gpu-check.sh runs, picked from cargo's JSON messages on stdin
(`cargo build/test ... --message-format=json`) and put in DIR under their target's name:

  gateway                    the server (http section)
  decode_bench, kernel_cache the examples (bench, nvrtc sections)
  gpu_decoder, gpu_parity    the engine's device tests (decoder, parity sections)
  every test binary of the kernels crate with tests for a real device (`cuda::...`),
                             also listed in DIR/kernel-tests (kernels, sanitize sections)

    gpu_check_bins.py DIR --copy   (the pack: copies that travel)
    gpu_check_bins.py DIR --link   (the dry run: links to the build here)

Fails, naming them, when any is missing. Standard library only.
"""

import json
import os
import shutil
import subprocess
import sys

WANT = {"gateway": "bin", "decode_bench": "example", "kernel_cache": "example",
        "gpu_decoder": "test", "gpu_parity": "test"}


def has_device_tests(exe):
    listed = subprocess.run([exe, "--list", "--include-ignored"], capture_output=True, text=True,
                            check=True).stdout
    return any(line.startswith("cuda::") for line in listed.splitlines())


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("--copy", "--link"):
        sys.exit(__doc__)
    out, how = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    found, kernel_tests = {}, []
    for line in sys.stdin:
        if not line.startswith("{"):
            continue
        m = json.loads(line)
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        name, kind = m["target"]["name"], m["target"]["kind"][0]
        # `cargo test` also builds a bin's unit tests as an executable of kind bin.
        if m["profile"]["test"] and kind != "test":
            continue
        package = m["package_id"].split("#")[0].rsplit("/", 1)[-1]
        if WANT.get(name) == kind:
            found[name] = m["executable"]
        elif kind == "test" and package == "kernels" and has_device_tests(m["executable"]):
            found[name] = m["executable"]
            kernel_tests.append(name)
    missing = sorted(set(WANT) - set(found))
    if missing or not kernel_tests:
        sys.exit(f"cargo built no {', '.join(missing) or 'kernel test with cuda:: tests'}")
    for name, exe in sorted(found.items()):
        dst = os.path.join(out, name)
        if os.path.lexists(dst):
            os.remove(dst)
        if how == "--copy":
            shutil.copy(exe, dst)
        else:
            os.symlink(exe, dst)
    with open(os.path.join(out, "kernel-tests"), "w") as f:
        f.write("".join(n + "\n" for n in sorted(kernel_tests)))
    print(f"{len(found)} binaries in {out}; kernel tests: {' '.join(sorted(kernel_tests))}")


if __name__ == "__main__":
    main()
