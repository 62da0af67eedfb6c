import json, sys, time
from jaxspec import LLM, SamplingParams
W = "/work/main/weights"
qs = [json.loads(l)["question"] for l in open("/work/shared/data/gsm8k_test.jsonl")][:int(sys.argv[1])]
spec = {"method": "eagle", "model": f"{W}/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}
llm = LLM(model=f"{W}/smollm2-135m-instruct", speculative_config=spec, max_num_seqs=16, max_model_len=1024,
          layer_loop="scan")
msgs = [[{"role": "user", "content": q}] for q in qs]
for name, kw in [("greedy", {}), ("presence0.5+lp5", dict(presence_penalty=0.5, logprobs=5)),
                 ("frequency0.5", dict(frequency_penalty=0.5)), ("repetition1.2", dict(repetition_penalty=1.2))]:
    b = llm.get_metrics()
    t = time.time()
    outs = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=int(sys.argv[2]), ignore_eos=True, **kw), use_tqdm=False)
    a = llm.get_metrics()
    d = a["num_drafts"] - b["num_drafts"]
    acc = a["num_accepted_tokens"] - b["num_accepted_tokens"]
    print(name, "mean acceptance length %.3f" % (1 + acc / d), "drafts", d, "s %.0f" % (time.time() - t), flush=True)
