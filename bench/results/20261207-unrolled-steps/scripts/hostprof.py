"""Print a cProfile of bench/throughput.py by own time, restricted to the engine's dispatch path: where a
multi-step dispatch's host time goes (python hostprof.py FILE.prof)."""
import pstats
import sys

stats = pstats.Stats(sys.argv[1])
stats.sort_stats("tottime").print_stats(r"llm_engine|model_runner|scheduler|pjit|pxla|array\.py|execute|asarray", 30)
stats.sort_stats("cumulative").print_stats(r"llm_engine\.py.*(_turn|_dispatch|_fetch|_commit)|model_runner\.py.*(_run|_place|decode)", 12)
