"""runtime/memory.py: glibc's malloc tuning and what is left of an RLIMIT_AS cap."""
from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from distfit.runtime.memory import limit_malloc_arenas, raise_mmap_threshold

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_malloc_tuning_is_accepted_on_glibc():
    # mallopt returns 0 for a parameter or value it refuses: True means glibc took every setting
    assert raise_mmap_threshold() is True
    assert limit_malloc_arenas() is True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")
def test_address_space_left_is_the_cap_less_vmsize():
    # In a child under a 6 GiB cap: the figure is the cap less VmSize as /proc/self/status states
    # it (kB, read independently of the statm pages the function reads), and None without a cap.
    script = textwrap.dedent("""
        import resource
        from distfit.runtime.memory import address_space_left
        before = address_space_left()
        cap = 6 << 30
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
        left = address_space_left()
        with open("/proc/self/status") as status:
            vm_size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        print(before, left, cap - vm_size)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "None"
    left, expected = int(out[1]), int(out[2])
    assert 0 < left <= 6 << 30
    assert abs(left - expected) <= 1 << 20  # the two reads are a few allocations apart
