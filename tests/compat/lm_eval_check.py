"""lm-eval-harness's ``local-completions`` model against a live gateway, on tiny tasks of its
own (YAML + JSONL written to a temporary directory: no data set is downloaded).

- ``loglikelihood``: a multiple_choice task (echo + logprobs, one request per choice); each
  choice's loglikelihood must equal the served model's own forward pass (transformers, float32)
  over the token ids lm-eval sent;
- ``rolling``: loglikelihood_rolling (perplexity: the whole text after the BOS token), against
  the same reference;
- ``generate_until``: greedy generations with ``until``; each must equal a plain
  /v1/completions request for the same token ids and stop strings;
- ``chat``: the same task through ``local-chat-completions`` with ``apply_chat_template``;
  each generation must equal a plain /v1/chat/completions request for the same messages.

Used by tests/compat/run_clients.py (lm-eval installed, ``--model-dir`` known).
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

LIMIT = 5
ATOL = 0.02  # nats per continuation: float32 CPU reference against the served engine's kernels

DATA: dict[str, list[dict[str, Any]]] = {
    "loglikelihood": [
        {"context": "Once upon a time, there was a little", "choices": ["girl", "car", "tree"], "label": 0},
        {"context": "The cat sat on the", "choices": ["mat", "sky", "river"], "label": 0},
        {"context": "She opened the door and", "choices": ["smiled", "blue", "seven"], "label": 0},
        {"context": "def add(a, b):\n    return", "choices": ["a + b", "dog", "then"], "label": 0},
        {"context": "They went to the park to", "choices": ["play", "green", "under"], "label": 0},
    ],
    "rolling": [
        {"text": "Once upon a time, there was a little girl who loved to play."},
        {"text": "The dog ran to the park and found a big red ball."},
        {"text": "import os\nprint(os.getcwd())"},
        {"text": "He was happy because the sun was shining."},
        {"text": "They ate cake and went to sleep."},
    ],
    "generate_until": [
        {"prompt": "Once upon a time", "target": ""},
        {"prompt": "The little dog", "target": ""},
        {"prompt": "def main():\n", "target": ""},
        {"prompt": "She said", "target": ""},
        {"prompt": "In the morning", "target": ""},
    ],
}

TASKS = {
    "loglikelihood": """output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - metric: acc
""",
    "rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
""",
    "generate_until": """output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{target}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - metric: exact_match
""",
}


def _write_task(kind: str, folder: Path) -> str:
    name = f"nj_compat_{kind}"
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DATA[kind]))
    head = (
        f"task: {name}\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    )
    (folder / f"{name}.yaml").write_text(head + TASKS[kind])
    return name


class Reference:
    """The served model's log-probabilities from its own weights (transformers, float32)."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logprob(self, ids: list[int], start: int) -> float:
        """Sum of log p(ids[i] | ids[:i]) for i in start .. len(ids) - 1."""
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([ids])).logits[0].float()
        lp = self.torch.log_softmax(logits, dim=-1)
        return float(sum(lp[i - 1, ids[i]] for i in range(start, len(ids))))


def _greedy(base: str, route: str, body: dict[str, Any]) -> str:
    req = urllib.request.Request(
        base + route, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        choice = json.load(resp)["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


def _check_generations(kind: str, lm: Any, samples: list[dict[str, Any]], base: str, model: str) -> None:
    for s in samples:
        context, kwargs = s["arguments"][0]
        body = {
            "model": model,
            "max_tokens": kwargs["max_gen_toks"],
            "temperature": 0,
            "stop": kwargs["until"],
        }
        if kind == "chat":
            body["messages"] = json.loads(context.prompt)  # lm-eval's JsonChatStr
            want = _greedy(base, "/chat/completions", body)
        else:
            body["prompt"] = lm.tok_encode(context)
            want = _greedy(base, "/completions", body)
        assert s["resps"][0][0] == want, (s["resps"][0][0], want)


def run(kind: str, base: str, model: str, model_dir: Path) -> None:
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    chat = kind == "chat"
    if chat:
        lm = get_model("local-chat-completions")(
            base_url=base + "/chat/completions", model=model, max_retries=1, max_gen_toks=16
        )
    else:
        lm = get_model("local-completions")(
            base_url=base + "/completions",
            model=model,
            tokenizer=str(model_dir),
            tokenizer_backend="huggingface",
            batch_size=4,  # a list of token-id prompts per request, as `--batch_size 4`
            max_retries=1,
            max_gen_toks=16,
        )
    with tempfile.TemporaryDirectory() as tmp:
        task = _write_task("generate_until" if chat else kind, Path(tmp))
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=[task],
            task_manager=TaskManager(include_path=tmp),
            limit=LIMIT,
            log_samples=True,
            apply_chat_template=chat,
        )
    assert out is not None
    samples = out["samples"][task]
    assert len(samples) == LIMIT, len(samples)
    if kind in ("generate_until", "chat"):
        _check_generations(kind, lm, samples, base, model)
        return
    ref = Reference(model_dir)
    worst = 0.0
    for s in samples:
        for args, resp in zip(s["arguments"], s["resps"], strict=True):
            if kind == "rolling":
                ids = [lm.prefix_token_id, *lm.tok_encode(args[0])]
                got, want = float(resp[0]), ref.logprob(ids, 1)
            else:
                context, continuation = lm._encode_pair(args[0], args[1])
                got, want = float(resp[0][0]), ref.logprob(context + continuation, len(context))
            worst = max(worst, abs(got - want))
            assert abs(got - want) <= ATOL, (args, got, want)
    print(f"    lm-eval {kind}: {out['results'][task]}; largest |served - reference| {worst:.4f} nats")
