"""What happens on the host right before XLA updates a step's CUDA graph: bench/throughput.py run with a marker line
on stderr at every plan write (plan_program), fresh `out` buffer (ModelRunner.output_buffer), jax.device_put and step
program call, interleaved with XLA's own command-buffer log (TF_CPP_VMODULE=command_buffer_thunk=3). Nothing reads a
device address (an address probe kept `out` from being donated, verify-gemms call 4).
(python when.py THROUGHPUT_ARGS...)"""
import sys

import jax

import jaxspec.engine.model_runner as model_runner
from jaxspec.bench.throughput import main


def mark(text: str) -> None:
    sys.stderr.write(f"MARK {text}\n")
    sys.stderr.flush()


_plan_program = model_runner.plan_program


def plan_program(buffers, plan):
    mark("plan write " + " ".join(str(a.shape) for a in plan))
    return _plan_program(buffers, plan)


_output_buffer = model_runner.ModelRunner.output_buffer


def output_buffer(self, step, spec, plan):
    mark(f"new out {step.__name__}")
    return _output_buffer(self, step, spec, plan)


_device_put = jax.device_put


def device_put(x, *args, **kwargs):
    mark("device_put " + str([getattr(a, "shape", type(a).__name__) for a in jax.tree.leaves(x)][:4]))
    return _device_put(x, *args, **kwargs)


_program = model_runner.ModelRunner._program


def program(step, size, spec, twin=0):
    fn = _program(step, size, spec, twin)

    def call(*args, **kwargs):
        mark(f"call {step.__name__} {size} k={spec.num_speculative_tokens} M={spec.num_steps} twin={twin}")
        return fn(*args, **kwargs)

    call._cache_size = fn._cache_size
    call.lower = fn.lower
    return call


model_runner.plan_program = plan_program
model_runner.ModelRunner.output_buffer = output_buffer
model_runner.ModelRunner._program = staticmethod(program)
jax.device_put = device_put
sys.argv = ["throughput.py"] + sys.argv[1:]
main()
