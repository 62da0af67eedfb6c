"""page_reserve_whole off and on in one process, alternating: bench/throughput.py with its timed rounds
(--repeats) run with EngineConfig.page_reserve_whole False, True, False, ... (the scheduler reads it at every step),
each round between MARK lines on stderr, where XLA's command-buffer log (TF_CPP_VMODULE=command_buffer_thunk=3)
shows the graph updates each round made; the end line counts the round's plan writes (plan_program calls).
(python ab.py THROUGHPUT_ARGS... --repeats 2N)"""
import sys

import jaxspec.bench.throughput as throughput
import jaxspec.engine.model_runner as model_runner

_run_point = throughput.run_point
_plan_program = model_runner.plan_program
rounds = []
writes = [0]


def plan_program(buffers, plan):
    writes[0] += 1
    return _plan_program(buffers, plan)


def run_point(llm, prompts, params, is_async):
    whole = len(rounds) % 2 == 1
    llm.llm_engine.scheduler.cfg.page_reserve_whole = whole
    sys.stderr.write(f"MARK round {len(rounds)} whole={whole} start\n")
    sys.stderr.flush()
    writes[0] = 0
    point, tokens = _run_point(llm, prompts, params, is_async)
    sys.stderr.write(f"MARK round {len(rounds)} whole={whole} end {point['output_tokens_per_s']:.1f} tok/s "
                     f"{point['wall_per_step_ms']:.3f} ms/step {point['outputs_sha256']} plan writes {writes[0]}\n")
    sys.stderr.flush()
    rounds.append((whole, point["output_tokens_per_s"]))
    return point, tokens


throughput.run_point = run_point
model_runner.plan_program = plan_program
sys.argv = ["throughput.py"] + sys.argv[1:]
try:
    throughput.main()
finally:
    for whole in (False, True):
        got = sorted(t for w, t in rounds if w == whole)
        print(f"page_reserve_whole={whole}: {', '.join(f'{t:.1f}' for t in got)} output tok/s"
              + (f", median {got[(len(got) - 1) // 2]:.1f}" if got else ""))
