"""bench/throughput.py with its busy-fraction trace at host tracer level 2 (XLA's executable, thunk and command-buffer
TraceMes, not only jit dispatch): `python traced.py THROUGHPUT_ARGS...`."""
import sys

import jax

import jaxspec.bench.profile as profile
from jaxspec.bench.throughput import main


def _host_options():
    opts = jax.profiler.ProfileOptions()
    opts.python_tracer_level, opts.host_tracer_level = 0, 2
    return opts


profile._quiet_options = _host_options
sys.argv = ["throughput.py"] + sys.argv[1:]
main()
