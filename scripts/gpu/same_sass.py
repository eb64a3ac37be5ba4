#!/usr/bin/env python3
"""Whether two builds of the kernels hold the same machine code, kernel by
kernel: a check, with no GPU, that a change meant to leave the kernels
alone (how they are compiled, grouped into programs or loaded) did.

    scripts/gpu/same_sass.py BASE NEW

BASE and NEW are CUBIN files or folders of them (a kernel cache's `cuda`
folder, e.g. filled by `TURBOSPARK_CACHE=DIR cargo run --release -p
turbospark-cuda --example kernel_cache -- 90` before and after the change).
Every kernel (by name) must be in exactly one CUBIN of each side, and its
instructions must be the same: text, encoding and control word (stall
counts, barriers, reuse), so the same results at the same speed. One
difference is allowed and counted: the offset of a global's address in
constant bank 4 (`c[0x4][...]`), which depends on the other globals of the
module, with the same control word.

Needs CUDA's `cuobjdump` and `nvdisasm` on PATH (or CUOBJDUMP=path), e.g.
from PyPI: `pip download --no-deps nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm`, unzip both, and put their `nvidia/cu13/bin` on PATH.
Exit status 0: the same; 1: a difference (printed); 2: usage or tools.
"""

import os
import re
import subprocess
import sys

FUNCTION = re.compile(r"\s+Function : (\S+)")
# `/*0040*/  IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;  /* 0x... */`, then the
# control word alone on the next line.
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,6}\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
CONTROL = re.compile(r"\s+/\* (0x[0-9a-f]{16}) \*/\s*$")
BANK4 = re.compile(r"c\[0x4\]\[0x[0-9a-f]+\]")


def cubins(path):
    if os.path.isdir(path):
        return sorted(
            os.path.join(path, f) for f in os.listdir(path) if f.endswith(".cubin")
        )
    return [path]


def kernels(path, tool):
    """{kernel: [(text, encoding, control)]} over the CUBINs at path."""
    found = {}
    for cubin in cubins(path):
        sass = subprocess.run(
            [tool, "-sass", cubin], capture_output=True, text=True, check=True
        ).stdout
        name = None
        for line in sass.splitlines():
            m = FUNCTION.match(line)
            if m:
                name = m.group(1)
                if name in found:
                    sys.exit(f"{path}: kernel {name} is in two CUBINs")
                found[name] = []
                continue
            if name is None:
                continue
            m = INSTRUCTION.search(line)
            if m:
                found[name].append([m.group(1), m.group(2), None])
                continue
            m = CONTROL.match(line)
            if m and found[name] and found[name][-1][2] is None:
                found[name][-1][2] = m.group(1)
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    try:
        base, new = (kernels(p, tool) for p in sys.argv[1:])
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"could not disassemble with {tool} (and nvdisasm): {e}", file=sys.stderr)
        sys.exit(2)
    differ = []
    bank4 = 0
    for name in sorted(set(base) | set(new)):
        a, b = base.get(name), new.get(name)
        if a is None or b is None:
            differ.append(f"{name}: only in {'NEW' if a is None else 'BASE'}")
            continue
        if len(a) != len(b):
            differ.append(f"{name}: {len(a)} instructions against {len(b)}")
            continue
        for at, (x, y) in enumerate(zip(a, b)):
            if x == y:
                continue
            if BANK4.sub("", x[0]) == BANK4.sub("", y[0]) and x[2] == y[2] and "c[0x4]" in x[0]:
                bank4 += 1
                continue
            differ.append(f"{name}: instruction {at}: {x[0]} ({x[1]} {x[2]}) against {y[0]} ({y[1]} {y[2]})")
            break
    count = sum(len(v) for v in base.values())
    print(
        f"{len(base)} kernels, {count} instructions; {bank4} differ only in a "
        f"constant-bank-4 address offset; {len(differ)} kernels differ otherwise"
    )
    for d in differ:
        print("  " + d)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
